"""A full disk: the error names the path being written, for a stage's own writes (publish) and for
a Spark job's (cluster_errors). The OS errors are real: writes to /dev/full fail with ENOSPC, and
where a user namespace can mount one, a 256 KiB tmpfs fills up under `dssm simulate` and `dssm clean`."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from core.artifacts import publish
from core.errors import DssmError
from core.spark import cluster_errors

# Opened without O_CREAT or O_TRUNC: where /dev/full is missing, nothing creates a file in its place.
needs_dev_full = pytest.mark.skipif(
    not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)), reason="no /dev/full device"
)


def write_to_full_device() -> None:
    """The kernel's own ENOSPC, not a raised stand-in."""
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        os.write(fd, b"x" * 4096)
    finally:
        os.close(fd)


@needs_dev_full
def test_a_stage_write_on_a_full_disk_names_the_output(tmp_path):
    def build(tmp: Path) -> dict:
        (tmp / "part-00000.jsonl").write_text("{}\n")
        write_to_full_device()
        return {}

    out = tmp_path / "out"
    said = rf"^no space left on device writing {re.escape(str(out))} \([\d,.]+ MB free\); free"
    with pytest.raises(DssmError, match=said):
        publish(out, "simulate", "code", {}, {}, build)
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


@needs_dev_full
def test_a_spark_job_that_runs_out_of_disk_says_so_naming_the_output(spark, tmp_path):
    def fill(batches):  # a task that writes where there is no space, as the impressions writer's tasks do
        import os

        for batch in batches:
            fd = os.open("/dev/full", os.O_WRONLY)
            os.write(fd, b"x" * 4096)
            yield batch

    out = tmp_path / "out"
    job = spark.range(8, numPartitions=2).mapInArrow(fill, "id long")
    message = rf"^no space left on device writing {re.escape(str(out))} \(a Spark job's write failed"
    with pytest.raises(DssmError, match=message), cluster_errors(out):
        job.write.parquet(str(out))
    with pytest.raises(ZeroDivisionError), cluster_errors(out):  # any other error is Spark's own
        raise ZeroDivisionError


def _can_mount_tmpfs(where: Path) -> bool:
    try:
        done = subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where}"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.integration
def test_simulate_and_clean_on_a_full_file_system_name_the_output(default_pairs, tmp_path):
    """`dssm simulate` used to say only "OSError: [Errno 28] No space left on device", and `dssm
    clean` a PythonException or py4j line without the cause or the path."""
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate

    full = tmp_path / "full"
    full.mkdir()
    if not _can_mount_tmpfs(full):
        pytest.skip("no user namespace to mount a small tmpfs in (unshare -rm)")
    logs = tmp_path / "sim"
    sim = SimulationConfig(impressions=20_000, shards=2, workers=1)
    simulate(default_pairs, logs, sim, {"path": "default", "sha256": "default"})
    commands = {
        "simulate": ["simulate", "--out", f"{full}/simulate", "--impressions", "50000", "--shards", "2"],
        "clean": ["clean", "--input", str(logs), "--out", f"{full}/clean", "--master", "local[1]"],
    }
    for name, args in commands.items():
        # a 256 KiB tmpfs in a mount namespace of this command alone, gone when it exits
        cli = " ".join([sys.executable, "-m", "dssm.cli", *(f"'{a}'" for a in args)])
        script = f"mount -t tmpfs -o size=256k tmpfs {full} && exec {cli}"
        done = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300, env=os.environ
        )
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2, done.stderr[-3000:]
        assert last.startswith(f"dssm {name}: error: no space left on device writing {full}/{name}"), last


@pytest.mark.integration
def test_training_on_a_full_file_system_says_so_in_one_line_and_leaves_no_half_checkpoint(tiny_data, tmp_path):
    """torch's own message was "[enforce fail at inline_container.cc:672] unexpected pos 64 vs 0", naming
    neither the disk nor the file. The run directory is a 16 KiB tmpfs: the first checkpoint does not fit."""
    full = tmp_path / "full"
    full.mkdir()
    if not _can_mount_tmpfs(full):
        pytest.skip("no user namespace to mount a small tmpfs in (unshare -rm)")
    keys = [f"data.negatives={tiny_data}/negatives", f"data.vocab={tiny_data}/vocab", f"out={full}/run"]
    keys += ["mlflow_uri=none", "max_steps=3", "data.batch_size=16", "model.ncell=64"]
    cli = " ".join([sys.executable, "-m", "dssm.cli", "train", *keys])
    script = f"mount -t tmpfs -o size=16k tmpfs {full} && {cli}; echo rc=$?; ls -A {full} {full}/run"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    last = [line for line in done.stderr.strip().splitlines() if line.startswith("dssm train:")][-1]
    assert "rc=2" in done.stdout, done.stderr[-3000:]
    assert re.match(rf"dssm train: error: no space left on device writing {full}/run \([\d.]+ MB free\)", last), last
    left = done.stdout.split("rc=2", 1)[1].split()
    assert not [f for f in left if f.endswith((".tmp", ".pt"))], left  # no half-written or partial checkpoint
