"""The pipeline's stages as plain functions: each takes paths and settings, returns a StageOutput.

No Prefect here: flows/retrain.py wraps each one in a task. Every stage caches by input hash in
its own manifest (core/artifacts.py: `publish`), so calling one whose inputs have not changed is a no-op,
and a stage that failed half-way left only a temp dir that the next call removes.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.artifacts import read_manifest, sha256_file
from core.errors import DssmError, StageFailed
from core.judgments import JudgedSet
from core.layout import Layout

if TYPE_CHECKING:
    from flows.config import EvaluateSection
    from jobs.clean import CleanConfig
    from jobs.negatives import NegativesConfig
    from jobs.propensity import PropensityConfig
    from jobs.simulate import SimulationConfig
    from jobs.vocab import VocabConfig
    from retrieval.index import IndexConfig

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
    with open(Layout(work).lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise DssmError(f"{work} is in use by another run ({handle.read().strip() or 'unknown'})") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield


def run_data_stage(stage: str, source: str | Path, out: Path, job: Callable[[], dict[str, Any]]) -> StageOutput:
    """Run one manifest-writing job (simulate, clean, vocab, negatives) and describe its output."""
    started = time.perf_counter()
    with failing_as(stage, source):
        manifest = job()
    return StageOutput(
        stage=stage,
        path=str(out),
        sha256=manifest["content_sha256"],
        skipped=bool(manifest.get("skipped")),
        seconds=round(time.perf_counter() - started, 2),
        counts=_flat_counts(manifest.get("counts", {})),
    )


def _flat_counts(counts: dict[str, Any]) -> dict[str, int]:
    sizes = {k: v.get("size") if isinstance(v, dict) else v for k, v in counts.items()}
    return {k: v for k, v in sizes.items() if isinstance(v, int)}


def simulate_stage(layout: Layout, judged: JudgedSet, cfg: SimulationConfig, force: bool) -> StageOutput:
    from jobs.simulate import simulate

    def job() -> dict[str, Any]:
        from tqdm import tqdm

        with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc="simulate", disable=None) as bar:
            return simulate(judged.pairs(), layout.simulate, cfg, judged.describe(), progress=bar.update, force=force)

    return run_data_stage("simulate", judged.path, layout.simulate, job)


def simulate_day_stage(layout: Layout, judged: JudgedSet, cfg: SimulationConfig, day: str, force: bool) -> StageOutput:
    """Windowed runs: simulate the run date's logs into the partition `WORKDIR/logs/dt=DAY` (kept
    when already there): new logs landing each night."""
    from dataclasses import replace

    from jobs.simulate import partition_name, simulate

    day_cfg = replace(cfg, day=day)
    out = layout.logs / partition_name(day)

    def job() -> dict[str, Any]:
        from tqdm import tqdm

        with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc=f"simulate {day}", disable=None) as bar:
            return simulate(judged.pairs(), out, day_cfg, judged.describe(), progress=bar.update, force=force)

    return run_data_stage("simulate", judged.path, out, job)


def clean_window_stage(
    layout: Layout, root: str, dates: list[str], cfg: CleanConfig, master: str | None, force: bool
) -> StageOutput:
    """Windowed runs: clean each day of `dates` under the log root `root` once (cached by its bytes)
    and sum the window's pairs into the clean stage's output."""
    from jobs.spark import LazySpark
    from jobs.window import clean_window

    out = layout.clean
    spark = LazySpark(master, "dssm-run")
    return run_data_stage(
        "clean", root, out, lambda: clean_window(spark, Path(root), dates, layout.clean_days, out, cfg, force)
    )


def clean_stage(layout: Layout, logs: str, cfg: CleanConfig, master: str | None, force: bool) -> StageOutput:
    from jobs.clean import clean
    from jobs.spark import LazySpark

    out = layout.clean
    return run_data_stage("clean", logs, out, lambda: clean(LazySpark(master, "dssm-run"), logs, out, cfg, force))


def propensity_stage(
    layout: Layout, clean_dir: str, cfg: PropensityConfig, master: str | None, force: bool
) -> StageOutput | None:
    """The position-bias curve of the clean stage's impressions; None when it wrote none (clean.impressions=false)."""
    from jobs.propensity import propensity
    from jobs.spark import LazySpark

    if "impressions" not in (read_manifest(Path(clean_dir)) or {}).get("outputs", {}):
        log.info("propensity: %s has no impressions/ (clean.impressions=false); position bias not estimated", clean_dir)
        return None
    out = layout.propensity
    return run_data_stage(
        "propensity",
        clean_dir,
        out,
        lambda: propensity(LazySpark(master, "dssm-run"), Path(clean_dir), out, cfg, force),
    )


def vocab_stage(layout: Layout, clean_dir: str, cfg: VocabConfig, master: str | None, force: bool) -> StageOutput:
    from jobs.spark import LazySpark
    from jobs.vocab import vocab

    out = layout.vocab
    return run_data_stage(
        "vocab", clean_dir, out, lambda: vocab(LazySpark(master, "dssm-run"), Path(clean_dir), out, cfg, force)
    )


def negatives_stage(
    layout: Layout,
    clean_dir: str,
    cfg: NegativesConfig,
    master: str | None,
    force: bool,
    propensity_dir: str | None = None,
) -> StageOutput:
    """The training rows; `propensity_dir` (the propensity stage's output) is read with `negatives.debias`."""
    from jobs.negatives import negatives
    from jobs.spark import LazySpark

    out = layout.negatives
    curve = Path(propensity_dir) if propensity_dir else None

    def build():
        return negatives(LazySpark(master, "dssm-run"), Path(clean_dir), out, cfg, force, propensity_dir=curve)

    return run_data_stage("negatives", clean_dir, out, build)


def default_nproc() -> int:
    """One rank per GPU when there are GPUs, else one CPU process."""
    import torch

    return torch.cuda.device_count() or 1


def warm_start_source(
    layout: Layout, mlflow_uri: str, name: str, overrides: list[str], negatives_sha: str, min_overlap: float
) -> tuple[str | None, str]:
    """(checkpoint, why) a windowed run's model starts from: the champion of registered model `name`
    when it has this model's config and its vocabulary covers at least `min_overlap` of this run's
    tokens, else (None, why not): from scratch. Decided once per training data version (the
    negatives' hash), so a rerun of the same night trains with the same start, and is skipped."""
    import json

    import mlflow
    from mlflow.exceptions import MlflowException

    from evaluation.registry import CHAMPION
    from modeling.checkpoint import read_checkpoint
    from modeling.config import load_config
    from modeling.hashing import Vocab
    from retrieval.index import copy_model_files, resolve_model

    decisions_path = layout.warm_start / "decisions.json"
    decisions = json.loads(decisions_path.read_text()) if decisions_path.exists() else {}
    cfg = load_config(None, overrides)
    key = f"{negatives_sha}:{cfg.model.encoder}"
    pinned = decisions.get(key)
    if pinned and (pinned["init_from"] is None or Path(pinned["init_from"]).is_file()):
        return pinned["init_from"], pinned["why"]  # else its checkpoint was deleted: decide again
    client = mlflow.MlflowClient(mlflow_uri)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    init_from, why = None, "no champion yet"
    if champion is not None:
        dest = layout.warm_start / f"v{champion.version}"
        checkpoint = dest / "model.pt"
        if not checkpoint.is_file():
            shutil.rmtree(dest, ignore_errors=True)  # a download cut short
            copy_model_files(resolve_model(f"models:/{name}/{champion.version}", mlflow_uri), dest)
        state = read_checkpoint(checkpoint)
        theirs = state["config"]["model"]
        ours = asdict(cfg.model)
        changed = sorted(k for k in ours if theirs.get(k) != ours[k])
        tokens = set(state["vocab"]["tokens"])
        vocab = Vocab.load(layout.vocab, cfg.model.tokens)
        overlap = sum(t in tokens for t in vocab.tokens) / max(vocab.size, 1)
        if changed:
            why = f"champion v{champion.version} has another model config ({', '.join(f'model.{k}' for k in changed)})"
        elif overlap < min_overlap:
            why = f"champion v{champion.version}'s vocabulary covers {overlap:.0%} of this one's (< {min_overlap:.0%})"
        else:
            init_from, why = str(checkpoint), f"champion v{champion.version} (vocabulary overlap {overlap:.0%})"
    decisions[key] = {"init_from": init_from, "why": why}
    layout.warm_start.mkdir(parents=True, exist_ok=True)
    tmp = decisions_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(decisions, indent=2) + "\n")
    os.replace(tmp, decisions_path)
    return init_from, why


def train_stage(layout: Layout, negatives_dir: str, overrides: list[str], nproc: int, force: bool) -> StageOutput:
    """Train, or resume an unfinished run, or skip a finished one; a run of other data, code or config
    is trained afresh (modeling.train.decide). nproc > 1 launches torchrun (NCCL on GPUs, gloo on CPU)."""
    from modeling.checkpoint import newest_checkpoint
    from modeling.config import load_config
    from modeling.data import plan, train_files
    from modeling.train import launch, resolve_paths, train

    started = time.perf_counter()
    with failing_as("train", negatives_dir):
        cfg = load_config(None, overrides)
        resolve_paths(cfg, layout.workdir)
        out = Path(cfg.out)
        if force and out.exists():
            log.info("train: --force; training %s afresh", out)
            shutil.rmtree(out)
        if nproc <= 1:
            summary = train(cfg, resume=True, on_change="restart")
        else:
            plan(train_files(Path(cfg.data.negatives)), cfg.data.batch_size, nproc)  # a bad layout fails here
            if launch(nproc, layout.workdir, overrides, resume=True, on_change="restart") != 0:
                raise DssmError(f"training failed in one of the {nproc} torchrun processes (their messages are above)")
            path, state = newest_checkpoint(out)
            summary = {"steps": state["step"], "valid_loss": state["valid_loss"]} | {
                "mlflow_run_id": state["mlflow_run_id"],
                "checkpoint": str(path),
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
    layout: Layout,
    checkpoints: list[str],
    judged: JudgedSet,
    section: EvaluateSection,
    negatives_dir: str,
    mlflow_uri: str | None,
    force: bool,
    run_date: str = "",
) -> tuple[StageOutput, dict[str, Any]]:
    """`dssm evaluate` of the trained models (and their hybrids with BM25, fit on the validation
    queries of `negatives_dir`) against the baselines, then the champion gate."""
    from evaluation.evaluate import EvaluateConfig, evaluate
    from evaluation.systems import parse_baselines

    out = layout.evaluate
    reports: list[dict[str, Any]] = []

    def job() -> dict[str, Any]:
        cfg = EvaluateConfig(
            judgments=judged,
            out=out,
            models=list(checkpoints),
            baselines=parse_baselines(",".join(section.baselines)),
            hybrid_dev=Path(negatives_dir) if section.hybrid else None,
            mlflow_uri=mlflow_uri,
            run_date=run_date,
            force=force,
        )
        reports.append(evaluate(cfg))
        return read_manifest(out) | {"skipped": bool(reports[0].get("skipped"))}

    stage = run_data_stage("evaluate", ", ".join(checkpoints), out, job)
    report = reports[0]
    stage.counts = {"queries": report["eval_queries"], "pairs": report["eval_pairs"]}
    return stage, report


def index_stage(
    layout: Layout, titles: str, model_uri: str, cfg: IndexConfig, mlflow_uri: str, master: str | None, force: bool
) -> StageOutput:
    """`dssm index` of `model_uri` (the champion) over `titles` (the clean stage's output, whose title
    pool is the default catalogue, or a catalogue file), logged as its retriever."""
    from jobs.spark import LazySpark
    from retrieval.index import index

    out = layout.index
    spark = LazySpark(master, "dssm-run")
    return run_data_stage(
        "index", model_uri, out, lambda: index(spark, model_uri, Path(titles), out, mlflow_uri, cfg, True, force)
    )


def analyze_stage(layout: Layout, checkpoints: list[str], judged: JudgedSet, force: bool) -> StageOutput | None:
    """`dssm analyze` of the first recurrent model (against the RNN when one was trained beside it) on
    the judged set's test queries, logged to its training run; None when no recurrent model was trained."""
    from analysis.lstm import RECURRENT
    from analysis.report import AnalyzeConfig, analyze
    from modeling.checkpoint import read_checkpoint

    encoders = {c: read_checkpoint(Path(c))["config"]["model"]["encoder"] for c in checkpoints}
    recurrent = [c for c in checkpoints if encoders[c] in RECURRENT]
    if not recurrent:
        log.info("analyze: no recurrent model among %s; nothing to analyse", ", ".join(sorted(set(encoders.values()))))
        return None
    main = next((c for c in recurrent if encoders[c] != "rnn"), recurrent[0])
    compare = next((c for c in recurrent if encoders[c] == "rnn" and c != main), None)
    out = layout.analysis
    cfg = AnalyzeConfig(model=main, out=out, compare=compare, judgments=judged, force=force)

    def job() -> dict[str, Any]:
        result = analyze(cfg)
        return read_manifest(out) | {"skipped": bool(result.get("skipped"))}

    return run_data_stage("analyze", main, out, job)
