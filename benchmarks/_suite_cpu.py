"""A pytest plugin: the CPU each test takes, with every process it starts (Spark's JVM and Python
workers, `dssm` subprocesses, servers), where the wall clock alone hides what a test costs the other
worker. Each xdist worker moves itself into a cpuacct cgroup of its own (cgroup v1, as root), so a test's
CPU is its worker cgroup's usage before and after it; module-scoped fixtures count in their first test.

    PYTHONPATH=benchmarks make test ARGS="-p _suite_cpu"

writes `suite-cpu-<worker>.tsv` (wall s, CPU s, test id; then the worker's total) into
$DSSM_SUITE_CPU_DIR (default: the temporary directory). Not for a run without workers, nor where
/sys/fs/cgroup/cpuacct is not writable (it then does nothing)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

CGROUPS = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None
_rows: list[tuple[str, float, float]] = []
_start = 0.0
_worker = ""


def _usage() -> float:
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _group, _start, _worker
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not _worker:
        return
    try:
        group = CGROUPS / f"dssm-suite-{_worker}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return  # no writable cpuacct hierarchy here: the suite runs as without the plugin
    _group = group
    _start = _usage()  # a group left by an earlier run has counted that run too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        yield
        return
    cpu, wall = _usage(), time.monotonic()
    yield
    _rows.append((item.nodeid, time.monotonic() - wall, _usage() - cpu))


def pytest_unconfigure(config) -> None:
    if _group is None:
        return
    out = Path(os.environ.get("DSSM_SUITE_CPU_DIR", tempfile.gettempdir()))
    lines = [f"{wall:.1f}\t{cpu:.1f}\t{test}" for test, wall, cpu in _rows]
    lines.append(f"total\t{_usage() - _start:.1f}\t{_worker}")
    (out / f"suite-cpu-{_worker}.tsv").write_text("\n".join(lines) + "\n")
