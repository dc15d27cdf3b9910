"""The pipeline's stages as plain functions: `stage(ctx, [item,] **reads) -> StageOutput | None`.

`ctx` is the run (its config, work dir layout, judged set, stores); `reads` are the outputs of the
stages it reads, by name, as flows/pipeline.py's PIPELINE lists them. No Prefect here: the flow
makes each one a task. Every stage caches by input hash in its own manifest (core/artifacts.py:
`publish`), so calling one whose inputs have not changed is a no-op, and a stage that failed
half-way left only a temp dir that the next call removes.
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

from core.artifacts import altered, read_manifest, sha256_file
from core.errors import DssmError, StageFailed
from core.judgments import JudgedSet
from core.layout import Layout

if TYPE_CHECKING:
    from flows.config import RunConfig
    from modeling.config import TrainConfig

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


@dataclass(frozen=True)
class RunContext:
    """One flow run, resolved once: what every stage may look at besides the outputs it reads."""

    cfg: RunConfig
    layout: Layout
    judged: JudgedSet
    mlflow_uri: str  # one store for every stage
    master: str | None  # Spark master; None: $DSSM_SPARK_MASTER, else local[*]
    window: list[str]  # the dates a windowed run reads, oldest first; empty: not windowed
    nproc: int  # training processes

    @property
    def force(self) -> bool:
        return self.cfg.force

    def spark(self):
        from jobs.spark import LazySpark

        return LazySpark(self.master, "dssm-run")


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
    return StageOutput.of_manifest(stage, out, manifest, time.perf_counter() - started)


def simulate_stage(ctx: RunContext) -> StageOutput:
    """Simulated logs of the judged set's train queries; in a windowed run, the run date's logs as the
    partition `WORKDIR/logs/dt=DAY` (kept when already there): new logs landing each night."""
    from dataclasses import replace

    from jobs.simulate import partition_name, simulate

    cfg, judged = ctx.cfg.simulate, ctx.judged
    day = ctx.window[-1] if ctx.window else ""
    out = ctx.layout.logs / partition_name(day) if day else ctx.layout.simulate

    def job() -> dict[str, Any]:
        from tqdm import tqdm

        desc = f"simulate {day}".strip()
        with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc=desc, disable=None) as bar:
            return simulate(
                judged.pairs(),
                out,
                replace(cfg, day=day) if day else cfg,
                judged.describe(),
                progress=bar.update,
                force=ctx.force,
            )

    return run_data_stage("simulate", judged.path, out, job)


def clean_stage(ctx: RunContext, simulate: StageOutput | None) -> StageOutput:
    """The raw logs (simulated, or `logs`) cleaned; in a windowed run, each day of the window under the
    log root cleaned once (cached by its bytes) and the window's pairs summed."""
    from jobs.clean import clean
    from jobs.window import clean_window

    out, cfg = ctx.layout.clean, ctx.cfg
    if ctx.window:
        root = cfg.logs or str(ctx.layout.logs)
        log.info("window %s..%s of %s", ctx.window[0], ctx.window[-1], root)
        days = ctx.layout.clean_days
        job = lambda: clean_window(ctx.spark(), root, ctx.window, days, out, cfg.clean, ctx.force)  # noqa: E731
        return run_data_stage("clean", root, out, job)
    logs = simulate.path if simulate else cfg.logs
    return run_data_stage("clean", logs, out, lambda: clean(ctx.spark(), logs, out, cfg.clean, ctx.force))


def propensity_stage(ctx: RunContext, clean: StageOutput) -> StageOutput | None:
    """The position-bias curve of the clean stage's impressions; None when it wrote none (clean.impressions=false)."""
    from jobs.propensity import propensity

    if "impressions" not in (read_manifest(Path(clean.path)) or {}).get("outputs", {}):
        log.info("propensity: %s has no impressions/ (clean.impressions=false); no position bias", clean.path)
        return None
    out = ctx.layout.propensity
    job = lambda: propensity(ctx.spark(), Path(clean.path), out, ctx.cfg.propensity, ctx.force)  # noqa: E731
    return run_data_stage("propensity", clean.path, out, job)


def vocab_stage(ctx: RunContext, clean: StageOutput) -> StageOutput:
    from jobs.vocab import vocab

    out = ctx.layout.vocab
    return run_data_stage(
        "vocab", clean.path, out, lambda: vocab(ctx.spark(), Path(clean.path), out, ctx.cfg.vocab, ctx.force)
    )


def negatives_stage(ctx: RunContext, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """The training rows; the propensity stage's curve is read with `negatives.debias`."""
    from jobs.negatives import negatives

    out, cfg = ctx.layout.negatives, ctx.cfg.negatives
    curve = Path(propensity.path) if propensity and cfg.debias else None

    def build():
        return negatives(ctx.spark(), Path(clean.path), out, cfg, ctx.force, propensity_dir=curve)

    return run_data_stage("negatives", clean.path, out, build)


def mine_stage(ctx: RunContext, negatives: StageOutput, clean: StageOutput, earlier_index: StageOutput | None):
    """The negatives with a share mined from the index an earlier run left (last night's champion's), or
    with BM25 over the title pool where there is none yet (jobs/mine.py)."""
    from jobs.mine import mine

    out, cfg = ctx.layout.mine, ctx.cfg.mine
    index = Path(earlier_index.path) if earlier_index is not None else None

    def build() -> dict[str, Any]:
        return mine(Path(negatives.path), Path(clean.path) / "titles", index, out, cfg, ctx.force)

    return run_data_stage("mine", negatives.path, out, build)


def teacher_stage(
    ctx: RunContext,
    negatives: StageOutput,
    clean: StageOutput,
    mine: StageOutput | None,
    earlier_index: StageOutput | None,
) -> StageOutput:
    """The training rows (mined ones when the mine stage ran) with one teacher list per train query
    (retrieval/teacher.py): candidates from BM25 and the index an earlier run left, scored by the teacher."""
    from retrieval.teacher import teacher

    rows = mine or negatives
    index = Path(earlier_index.path) if earlier_index is not None else None

    def build() -> dict[str, Any]:
        titles = Path(clean.path) / "titles"
        return teacher(Path(rows.path), titles, index, ctx.layout.teacher, ctx.cfg.teacher, ctx.force)

    return run_data_stage("teacher", rows.path, ctx.layout.teacher, build)


def default_nproc() -> int:
    """One rank per GPU when there are GPUs, else one CPU process."""
    import torch

    return torch.cuda.device_count() or 1


def train_stage(
    ctx: RunContext,
    encoder: str,
    negatives: StageOutput,
    vocab: StageOutput,
    mine: StageOutput | None,
    teacher: StageOutput | None,
) -> StageOutput:
    """One model of `train.models` on the negatives (with the teacher's lists, or the mined ones, when
    those stages ran) and the vocabulary, into WORKDIR/train/ENCODER; in a windowed run warm-started
    from the champion when it fits (flows/warm_start.py)."""
    negatives = teacher or mine or negatives
    from dataclasses import replace

    from evaluation.registry import registered_name
    from flows.warm_start import warm_start_source

    own = ctx.cfg.train.for_encoder(encoder)  # the section with the encoder's train.per_encoder keys
    cfg = replace(
        own,
        experiment=ctx.judged.name,
        dataset=ctx.judged.name,
        mlflow_uri=ctx.mlflow_uri,
        data=replace(own.data, negatives=negatives.path, vocab=vocab.path),
    )
    if ctx.window and ctx.cfg.train.warm_start:
        name = registered_name(ctx.judged.name)
        init_from, why = warm_start_source(
            ctx.layout, ctx.mlflow_uri, name, cfg, negatives.sha256, ctx.cfg.train.warm_min_overlap
        )
        log.info("train %s: %s", encoder, f"warm start from {why}" if init_from else f"from scratch: {why}")
        cfg = replace(cfg, init_from=init_from) if init_from else cfg
    return train_model(ctx.layout, cfg, ctx.nproc, ctx.force)


def train_model(layout: Layout, cfg: TrainConfig, nproc: int, force: bool) -> StageOutput:
    """Train, or resume an unfinished run, or skip a finished one; a run of other data, code or config
    is trained afresh (modeling.resume.decide). nproc > 1 launches torchrun (NCCL on GPUs, gloo on CPU)
    with the resolved config."""

    from modeling.checkpoint import newest_checkpoint
    from modeling.launch import launch
    from modeling.train import resolve_paths, train

    started = time.perf_counter()
    with failing_as("train", cfg.data.negatives or layout.negatives):
        cfg = resolve_paths(cfg, layout.workdir)
        out = Path(cfg.out)
        if force and out.exists():
            log.info("train: --force; training %s afresh", out)
            shutil.rmtree(out)
        if nproc <= 1:
            summary = train(cfg, resume=True, on_change="restart")
        else:
            if launch(nproc, cfg, resume=True, on_change="restart") != 0:
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


def evaluate_stage(ctx: RunContext, train: list[StageOutput], negatives: StageOutput) -> StageOutput:
    """`dssm evaluate` of the trained models (and their hybrids with BM25, fit on the validation
    queries of the negatives) against the baselines, then the champion gate; its report.json and
    gate.json are the flow's report."""
    from evaluation.evaluate import EvaluateConfig, evaluate
    from evaluation.systems import parse_baselines

    out, section = ctx.layout.evaluate, ctx.cfg.evaluate
    checkpoints = [t.path for t in train]
    reports: list[dict[str, Any]] = []

    def job() -> dict[str, Any]:
        cfg = EvaluateConfig(
            judgments=ctx.judged,
            out=out,
            models=checkpoints,
            baselines=parse_baselines(",".join(section.baselines)),
            hybrid_dev=Path(negatives.path) if section.hybrid else None,
            fusions=section.fusions,
            mlflow_uri=ctx.mlflow_uri,
            run_date=ctx.window[-1] if ctx.window else "",
            force=ctx.force,
            retrieval=section.retrieval,
            gate_metric=section.gate_metric,
        )
        reports.append(evaluate(cfg))
        return read_manifest(out) | {"skipped": bool(reports[0].get("skipped"))}

    stage = run_data_stage("evaluate", ", ".join(checkpoints), out, job)
    stage.counts = {"queries": reports[0]["eval_queries"], "pairs": reports[0]["eval_pairs"]}
    return stage


def index_stage(ctx: RunContext, clean: StageOutput) -> StageOutput:
    """`dssm index` of the champion over `catalogue` (default: the clean stage's title pool), logged as
    its retriever."""
    from evaluation.registry import CHAMPION, registered_name
    from retrieval.index import index

    out = ctx.layout.index
    champion = f"models:/{registered_name(ctx.judged.name)}@{CHAMPION}"
    titles = Path(ctx.cfg.catalogue or clean.path)

    def job() -> dict[str, Any]:
        return index(ctx.spark(), champion, titles, out, ctx.mlflow_uri, ctx.cfg.index, True, ctx.force)

    return run_data_stage("index", champion, out, job)


def analyze_stage(ctx: RunContext, train: list[StageOutput]) -> StageOutput | None:
    """`dssm analyze` of the first recurrent model (against the RNN when one was trained beside it) on
    the judged set's test queries, logged to its training run; None when no recurrent model was trained."""
    from analysis.lstm import RECURRENT
    from analysis.report import AnalyzeConfig, analyze
    from modeling.checkpoint import read_checkpoint

    checkpoints = [t.path for t in train]
    encoders = {c: read_checkpoint(Path(c))["config"]["model"]["encoder"] for c in checkpoints}
    recurrent = [c for c in checkpoints if encoders[c] in RECURRENT]
    if not recurrent:
        log.info("analyze: no recurrent model among %s; nothing to analyse", ", ".join(sorted(set(encoders.values()))))
        return None
    main = next((c for c in recurrent if encoders[c] != "rnn"), recurrent[0])
    compare = next((c for c in recurrent if encoders[c] == "rnn" and c != main), None)
    out = ctx.layout.analyze
    cfg = AnalyzeConfig(model=main, out=out, compare=compare, judgments=ctx.judged, force=ctx.force)

    def job() -> dict[str, Any]:
        result = analyze(cfg)
        return read_manifest(out) | {"skipped": bool(result.get("skipped"))}

    return run_data_stage("analyze", main, out, job)
