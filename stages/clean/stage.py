"""The clean stage: raw logs parsed, validated and counted (stages/clean/job.py; windowed: window.py)."""

from __future__ import annotations

from core.stage import RunContext, StageOutput, run_data_stage
from stages.clean.config import CleanConfig


def run(ctx: RunContext, settings: CleanConfig, simulate: StageOutput | None) -> StageOutput:
    """The raw logs (simulated, or `logs`) cleaned; in a windowed run, each day of the window under the
    log root cleaned once (cached by its bytes) and the window's pairs summed, but for the time split's
    test day (`ctx.test_day`: cleaned for the judge stage alone)."""
    import logging

    from core.spark import run_session
    from stages.clean.job import clean
    from stages.clean.window import clean_window

    out, spark = ctx.layout.clean, run_session(ctx.master)
    if ctx.window:
        root = ctx.cfg.logs or str(ctx.layout.logs)
        logging.getLogger("dssm.flow").info("window %s..%s of %s", ctx.window[0], ctx.window[-1], root)
        days = ctx.layout.clean_days
        held_out = ctx.test_day
        job = lambda: clean_window(spark, root, ctx.window, days, out, settings, ctx.force, held_out)  # noqa: E731
        return run_data_stage("clean", root, out, job)
    logs = simulate.path if simulate else ctx.cfg.logs
    return run_data_stage("clean", logs, out, lambda: clean(spark, logs, out, settings, ctx.force))


def log_to_training_runs(ctx: RunContext, output: StageOutput, run_ids: list[str]) -> None:
    """The flow's hook after the walk, in a windowed run: its dates and partition hashes (the days summed:
    not the time split's test day, tagged `test_day`) as dataset inputs and tags of each training run
    (evaluation tags the versions it registers with the run date). Logged on every run, skipped training
    included: MLflow keeps one input per dataset digest, so a run killed before this point is completed by
    its rerun. The tags stay those of the night that trained it: a later night that skipped the training
    (its days less its test day were the same) adds none."""
    if not ctx.window:
        return
    from pathlib import Path

    from core.tracking import client, log_datasets
    from stages.clean.window import window_inputs

    runs = client(ctx.mlflow_uri)
    days = window_inputs(Path(output.path))
    night = {"window": f"{ctx.window[0]}..{ctx.window[-1]}", "run_date": ctx.window[-1]}
    night |= {"test_day": ctx.test_day} if ctx.test_day else {}
    for run_id in run_ids:
        log_datasets(ctx.mlflow_uri, run_id, [(name, path, sha, "training") for name, path, sha in days])
        tagged = runs.get_run(run_id).data.tags
        for key, value in night.items():
            if key not in tagged:
                runs.set_tag(run_id, key, value)
