"""The register stage: each evaluated model an MLflow model and a version of dssm-DATASET (stages/register/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, evaluate: StageOutput) -> StageOutput:
    """`dssm register` of the evaluated models: MLflow models, versions of dssm-DATASET."""
    from stages.register.job import register as register_models

    out = ctx.layout.output("register")
    run_date = ctx.window[-1] if ctx.window else ""
    job = lambda: register_models(Path(evaluate.path), out, run_date, ctx.force)  # noqa: E731
    return run_data_stage("register", evaluate.path, out, job)
