"""The negatives stage: the training rows (stages/negatives/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.negatives.config import NegativesConfig


def run(ctx: RunContext, settings: NegativesConfig, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """The training rows; the propensity stage's curve is read with `negatives.debias`."""
    from core.spark import run_session
    from stages.negatives.job import negatives

    out, cfg, spark = ctx.layout.negatives, settings, run_session(ctx.master)
    curve = Path(propensity.path) if propensity and cfg.debias else None

    def build() -> dict[str, Any]:
        return negatives(spark, Path(clean.path), out, cfg, ctx.force, propensity_dir=curve)

    return run_data_stage("negatives", clean.path, out, build)
