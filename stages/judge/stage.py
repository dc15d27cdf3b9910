"""The judge stage: a judged set graded from the logs' clicks, when logs come without one (stages/judge/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """Grade the clean stage's impressions by their clicks (over the propensity stage's expected
    examinations with `judge.debias`); evaluate, index and analyze then read this judged set."""
    from core.spark import run_session
    from stages.judge.job import judge

    cfg, out, spark = ctx.cfg.judge, ctx.layout.output("judge"), run_session(ctx.master)
    curve = Path(propensity.path) if propensity is not None else None
    job = lambda: judge(spark, Path(clean.path), out, cfg, ctx.force, curve)  # noqa: E731
    return run_data_stage("judge", clean.path, out, job)
