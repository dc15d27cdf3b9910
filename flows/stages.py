"""The pipeline's stages as plain functions: each takes paths and settings, returns a StageOutput.

No Prefect here: flows/retrain.py wraps each one in a task. Every stage caches by input hash in
its own manifest (dssm/artifacts.py), so calling one whose inputs have not changed is a no-op,
and a stage that failed half-way left only a temp dir that the next call removes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dssm.artifacts import MANIFEST, read_manifest, sha256_file
from dssm.errors import DssmError, StageFailed
from dssm.judgments import JudgedSetSpec

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


@contextmanager
def failing_as(stage: str, source: str | Path) -> Iterator[None]:
    """Any failure inside becomes a StageFailed that names the stage and its input."""
    try:
        yield
    except StageFailed:
        raise
    except Exception as e:  # KeyboardInterrupt passes through: an interrupt is not a stage failure
        raise StageFailed(stage, str(source), e) from e


@contextmanager
def exclusive(work: Path) -> Iterator[None]:
    """Hold WORKDIR/.lock for one run: two runs in one work dir would train into the same checkpoint."""
    import fcntl

    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise DssmError(f"{work} is in use by another run ({handle.read().strip() or 'unknown'})") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield


def _manifest_id(out: Path) -> tuple[int, int] | None:
    """Changes whenever the stage (re)writes its output: publication renames a new directory in."""
    path = out / MANIFEST
    if not path.exists():
        return None
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def run_data_stage(stage: str, source: str | Path, out: Path, job: Callable[[], dict[str, Any]]) -> StageOutput:
    """Run one manifest-writing job (simulate, clean, vocab, negatives) and describe its output."""
    before = _manifest_id(out)
    started = time.perf_counter()
    with failing_as(stage, source):
        manifest = job()
    return StageOutput(
        stage=stage,
        path=str(out),
        sha256=manifest["content_sha256"],
        skipped=before is not None and before == _manifest_id(out),
        seconds=round(time.perf_counter() - started, 2),
        counts=_flat_counts(manifest.get("counts", {})),
    )


def _flat_counts(counts: dict[str, Any]) -> dict[str, int]:
    sizes = {k: v.get("size") if isinstance(v, dict) else v for k, v in counts.items()}
    return {k: v for k, v in sizes.items() if isinstance(v, int)}


def simulate_stage(
    out: Path, judgments: str | None, spec: JudgedSetSpec, settings: dict[str, Any], force: bool
) -> StageOutput:
    from jobs.simulate import SimulationConfig, judged_source, simulate

    cfg = SimulationConfig(**settings)

    def job() -> dict[str, Any]:
        from tqdm import tqdm

        pairs, source = judged_source(Path(judgments) if judgments else None, spec)
        with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc="simulate", disable=None) as bar:
            return simulate(pairs, out, cfg, source, progress=bar.update, force=force)

    return run_data_stage("simulate", judgments or "the embedded default catalogue", out, job)


def clean_stage(work: Path, logs: str, master: str | None, force: bool) -> StageOutput:
    from jobs.clean import clean
    from jobs.spark import LazySpark

    out = work / "clean"
    return run_data_stage("clean", logs, out, lambda: clean(LazySpark(master, "dssm-run"), logs, out, force=force))


def vocab_stage(work: Path, clean_dir: str, master: str | None, force: bool) -> StageOutput:
    from jobs.spark import LazySpark
    from jobs.vocab import vocab

    out = work / "vocab"
    return run_data_stage(
        "vocab", clean_dir, out, lambda: vocab(LazySpark(master, "dssm-run"), Path(clean_dir), out, force=force)
    )


def negatives_stage(work: Path, clean_dir: str, n: int, master: str | None, force: bool) -> StageOutput:
    from jobs.negatives import NegativesConfig, negatives
    from jobs.spark import LazySpark

    out = work / "negatives"

    def job() -> dict[str, Any]:
        return negatives(LazySpark(master, "dssm-run"), Path(clean_dir), out, NegativesConfig(n=n), force=force)

    return run_data_stage("negatives", clean_dir, out, job)


def default_nproc() -> int:
    """One rank per GPU when there are GPUs, else one CPU process."""
    import torch

    return torch.cuda.device_count() or 1


def train_stage(work: Path, negatives_dir: str, overrides: list[str], nproc: int, force: bool) -> StageOutput:
    """Train, or resume an unfinished run, or skip a finished one; a run whose data or config
    changed is trained afresh. nproc > 1 launches torchrun (NCCL on GPUs, gloo on CPU)."""
    from modeling.checkpoint import LAST, read_checkpoint
    from modeling.config import load_config
    from modeling.data import plan, train_files
    from modeling.train import launch, resolve_paths, stale_run, train

    started = time.perf_counter()
    with failing_as("train", negatives_dir):
        cfg = load_config(None, overrides)
        resolve_paths(cfg, work)
        out = Path(cfg.out)
        why = "--force" if force else stale_run(cfg)
        if why and out.exists():
            log.info("train: %s; training %s afresh", why, out)
            shutil.rmtree(out)
        if nproc <= 1:
            summary = train(cfg, resume=True)
        else:
            plan(train_files(Path(cfg.data.negatives)), cfg.data.batch_size, nproc)  # a bad layout fails here
            args = argparse.Namespace(nproc=nproc, workdir=work, config=None, resume=True, overrides=overrides)
            if launch(args) != 0:
                raise DssmError(f"training failed in one of the {nproc} torchrun processes (their messages are above)")
            state = read_checkpoint(out / LAST)
            summary = {"steps": state["step"], "valid_loss": state["valid_loss"]} | {
                "mlflow_run_id": state["mlflow_run_id"],
                "checkpoint": str(out / LAST),
            }
        checkpoint = Path(summary["checkpoint"])
        sha = sha256_file(checkpoint)
    return StageOutput(
        stage="train",
        path=str(checkpoint),
        sha256=sha,
        skipped=bool(summary.get("skipped")),
        seconds=round(time.perf_counter() - started, 2),
        counts={
            "steps": summary["steps"],
            "valid_loss": summary["valid_loss"],
            "mlflow_run_id": summary["mlflow_run_id"],
            "nproc": nproc,
        },
    )


def evaluate_stage(
    work: Path,
    checkpoints: list[str],
    judgments: str | None,
    spec: JudgedSetSpec,
    baselines: list[str],
    mlflow_uri: str | None,
    force: bool,
) -> tuple[StageOutput, dict[str, Any]]:
    from evaluation.evaluate import EvaluateConfig, evaluate
    from evaluation.systems import parse_baselines
    from jobs.catalogue import DEFAULT_CATALOGUE

    out = work / "eval"
    reports: list[dict[str, Any]] = []

    def job() -> dict[str, Any]:
        reports.append(
            evaluate(
                EvaluateConfig(
                    judgments=Path(judgments or DEFAULT_CATALOGUE),
                    out=out,
                    models=list(checkpoints),
                    baselines=parse_baselines(",".join(baselines)),
                    spec=spec,
                    dataset=dataset_of(judgments),
                    mlflow_uri=mlflow_uri,
                    force=force,
                )
            )
        )
        return read_manifest(out)

    stage = run_data_stage("evaluate", ", ".join(checkpoints), out, job)
    report = reports[0]
    stage.counts = {"queries": report["eval_queries"], "pairs": report["eval_pairs"]}
    return stage, report


def analyze_stage(
    work: Path, checkpoints: list[str], judgments: str | None, spec: JudgedSetSpec, force: bool
) -> StageOutput | None:
    """`dssm analyze` of the first recurrent model (against the RNN when one was trained beside it) on
    the judged set's test queries, logged to its training run; None when no recurrent model was trained."""
    from analysis.lstm import RECURRENT
    from analysis.report import AnalyzeConfig, analyze
    from jobs.catalogue import DEFAULT_CATALOGUE
    from modeling.checkpoint import read_checkpoint

    encoders = {c: read_checkpoint(Path(c))["config"]["model"]["encoder"] for c in checkpoints}
    recurrent = [c for c in checkpoints if encoders[c] in RECURRENT]
    if not recurrent:
        log.info("analyze: no recurrent model among %s; nothing to analyse", ", ".join(sorted(set(encoders.values()))))
        return None
    main = next((c for c in recurrent if encoders[c] != "rnn"), recurrent[0])
    compare = next((c for c in recurrent if encoders[c] == "rnn" and c != main), None)
    out = work / "analysis"
    cfg = AnalyzeConfig(model=main, out=out, compare=compare, judgments=Path(judgments or DEFAULT_CATALOGUE), spec=spec)
    cfg.force = force

    def job() -> dict[str, Any]:
        analyze(cfg)
        return read_manifest(out)

    return run_data_stage("analyze", main, out, job)


def dataset_of(judgments: str | None) -> str:
    """The dataset name runs are filed under: the MLflow experiment and the `dataset` tag."""
    from evaluation.protocol import dataset_name

    return "default-catalogue" if judgments is None else dataset_name(Path(judgments))
