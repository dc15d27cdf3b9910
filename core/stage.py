"""What a pipeline stage is handed and hands on: the run (`RunContext`) and its output (`StageOutput`).

A stage is `run(ctx, [item,] [settings,] **reads) -> StageOutput | None` in its package's `stage` module
(stages/clean/stage.py, stages/evaluate/stage.py, ...): `ctx` is the run, `settings` its own run-config
section, `reads` the outputs of the stages it reads, by name, as flows/pipeline.py's PIPELINE lists them.
No Prefect here: the flow makes each one a task. Every stage caches by input hash in its own manifest
(core/artifacts.py: `publish`), so calling one whose inputs have not changed is a no-op, and a stage that
failed half-way left only a temp dir that the next call removes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.artifacts import altered, read_manifest
from core.errors import StageFailed
from core.judgments import JudgedSet
from core.layout import Layout
from core.stopping import stop_behind

log = logging.getLogger("dssm.flow")


@dataclass
class StageOutput:
    """What one stage hands to the next: where its output is and the hash of its content."""

    stage: str
    path: str
    sha256: str
    skipped: bool  # the output was already up to date
    seconds: float
    counts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_manifest(cls, stage: str, path: Path, manifest: dict[str, Any], seconds: float = 0.0) -> StageOutput:
        """The output a manifest describes (its content hash, its integer counts)."""
        sizes = {k: v.get("size") if isinstance(v, dict) else v for k, v in manifest.get("counts", {}).items()}
        counts = {k: v for k, v in sizes.items() if isinstance(v, int)}
        skipped = bool(manifest.get("skipped"))
        return cls(stage, str(path), manifest["content_sha256"], skipped, round(seconds, 2), counts)

    @classmethod
    def left_by_earlier_run(cls, stage: str, path: Path) -> StageOutput | None:
        """What an earlier run's stage left at `path` (e.g. last night's index), None when nothing is there."""
        manifest = read_manifest(path)
        if not manifest or "content_sha256" not in manifest:
            return None
        problem = altered(path, manifest)  # what reads it would fail on every night, before its stage rebuilt it
        if problem:
            log.warning("%s left by an earlier run is damaged (%s): this run goes on without it", path, problem)
            return None
        return cls.of_manifest(stage, path, manifest | {"skipped": True})


class RunSettings(Protocol):
    """The run-wide settings a stage may read besides its own section, which the pipeline hands it as
    `settings=` (flows/pipeline.py). The flow's RunConfig is one; core names no flow."""

    force: bool  # recompute every stage
    logs: str  # raw logs to ingest instead of simulating; empty: simulated


@dataclass(frozen=True)
class RunContext:
    """One flow run, resolved once: what every stage may look at besides the outputs it reads."""

    cfg: RunSettings
    layout: Layout
    judged: JudgedSet
    mlflow_uri: str  # one store for every stage
    master: str | None  # Spark master; None: $DSSM_SPARK_MASTER, else local[*]
    window: list[str]  # the dates a windowed run reads, oldest first; empty: not windowed
    nproc: int  # training processes
    # judge.split=time: the day of the window whose traffic the evaluation set is graded from; no stage that
    # training reads sees it while the set is in use (stages/judge/stage.py's held_out_day). "": none
    test_day: str = ""

    @property
    def force(self) -> bool:
        return self.cfg.force


@contextmanager
def failing_as(stage: str, source: str | Path) -> Iterator[None]:
    """Any failure inside becomes a StageFailed that names the stage and its input."""
    try:
        yield
    except StageFailed:
        raise
    except Exception as e:  # KeyboardInterrupt passes through: an interrupt is not a stage failure
        stop = stop_behind(e)
        if stop is not None:  # a stop a library caught and turned into its own error: still a stop
            raise stop from e
        raise StageFailed(stage, str(source), e) from e


def run_data_stage(stage: str, source: str | Path, out: Path, job: Callable[[], dict[str, Any]]) -> StageOutput:
    """Run one manifest-writing job (simulate, clean, vocab, negatives) and describe its output."""
    started = time.perf_counter()
    with failing_as(stage, source):
        manifest = job()
    return StageOutput.of_manifest(stage, out, manifest, time.perf_counter() - started)
