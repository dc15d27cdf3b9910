"""The train stage: one model per encoder of `train.models`, resumed or warm-started (modeling/train.py).

The stage, not modeling/, decides the warm start: a windowed run starts from the registered champion
(warm_start.py), which modeling, below the registry, cannot read.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core.artifacts import sha256_file
from core.errors import DssmError
from core.layout import Layout
from core.stage import RunContext, StageOutput, failing_as

if TYPE_CHECKING:
    from modeling.config import TrainJob
    from stages.train.config import TrainConfig

log = logging.getLogger("dssm.flow")


def run(
    ctx: RunContext,
    encoder: str,
    settings: TrainConfig,
    rows: StageOutput,
    vocab: StageOutput,
) -> StageOutput:
    """One model of `train.models` on the training rows (the pipeline hands the teacher's lists, the mined
    negatives or the sampled ones: the first of those that ran) and the vocabulary, into
    WORKDIR/train/ENCODER; in a windowed run warm-started from the champion when it fits (warm_start.py)."""
    from dataclasses import replace

    from modeling.config import TrainJob
    from modeling.distributed import device_kind
    from scoring.serving import registered_name
    from stages.train.warm_start import warm_start_source

    device = device_kind(settings.for_encoder(encoder))  # its own `device` key too; ENCODER@cuda on a GPU
    cfg = TrainJob.of(
        settings.for_encoder(encoder, device),  # the section with the encoder's train.per_encoder keys
        rows.path,
        vocab.path,
        experiment=ctx.judged.name,
        dataset=ctx.judged.name,
        mlflow_uri=ctx.mlflow_uri,
    )
    if ctx.window and settings.warm_start:
        name = registered_name(ctx.judged.name)
        init_from, why = warm_start_source(
            ctx.layout, ctx.mlflow_uri, name, cfg, rows.sha256, settings.warm_min_overlap, ctx.window[-1]
        )
        log.info("train %s: %s", encoder, f"warm start from {why}" if init_from else f"from scratch: {why}")
        cfg = replace(cfg, init_from=init_from) if init_from else cfg
    return train_model(ctx.layout, cfg, ctx.nproc, ctx.force)


def train_model(layout: Layout, cfg: TrainJob, nproc: int, force: bool) -> StageOutput:
    """Train, or resume an unfinished run, or skip a finished one; a run of other data, code or config
    is trained afresh (modeling.resume.decide). nproc > 1 launches torchrun (NCCL on GPUs, gloo on CPU)
    with the resolved config."""

    from modeling.checkpoint import newest_checkpoint
    from modeling.distributed import device_kind
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
            "device": summary.get("device") or device_kind(cfg),
        },
    )
