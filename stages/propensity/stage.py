"""The propensity stage: the examination probability of each rank (stages/propensity/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, clean: StageOutput) -> StageOutput | None:
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
    job = lambda: propensity(spark, Path(clean.path), out, ctx.cfg.propensity, ctx.force)  # noqa: E731
    return run_data_stage("propensity", clean.path, out, job)
