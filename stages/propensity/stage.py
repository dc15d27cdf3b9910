"""The propensity stage: the examination probability of each rank (stages/propensity/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage
from stages.propensity.config import PropensityConfig


def run(ctx: RunContext, settings: PropensityConfig, clean: StageOutput) -> StageOutput | None:
    """The position-bias curve of the clean stage's impressions; None when it wrote none (clean.impressions=false)."""
    import logging

    from core.artifacts import read_manifest
    from core.spark import run_session
    from stages.propensity.job import propensity

    if "impressions" not in (read_manifest(Path(clean.path)) or {}).get("outputs", {}):
        logging.getLogger("dssm.flow").info(
            "propensity: %s has no impressions/ (clean.impressions=false); no position bias", clean.path
        )
        return None
    out, spark = ctx.layout.propensity, run_session(ctx.master)
    job = lambda: propensity(spark, Path(clean.path), out, settings, ctx.force)  # noqa: E731
    return run_data_stage("propensity", clean.path, out, job)


def log_to_training_runs(ctx: RunContext, output: StageOutput, run_ids: list[str]) -> None:
    """The flow's hook after the walk: the position-bias curve the logs showed (examination per rank,
    relative to rank 1) as metrics `examination_rank_K` and the curve's JSON and plot, in each training run."""
    from core.tracking import client
    from stages.propensity.job import CURVE_FILE, PLOT_FILE, read_curve

    runs = client(ctx.mlflow_uri)
    curve = read_curve(Path(output.path))
    for run_id in run_ids:
        for rank, value in zip(curve["ranks"], curve["examination"], strict=True):
            runs.log_metric(run_id, f"examination_rank_{rank}", value)
        for name in (CURVE_FILE, PLOT_FILE):
            runs.log_artifact(run_id, str(Path(output.path) / name), "propensity")
