"""The clean stage: raw logs parsed, validated and counted (stages/clean/job.py; windowed: window.py)."""

from __future__ import annotations

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, simulate: StageOutput | None) -> StageOutput:
    """The raw logs (simulated, or `logs`) cleaned; in a windowed run, each day of the window under the
    log root cleaned once (cached by its bytes) and the window's pairs summed, but for the time split's
    test day (`ctx.test_day`: cleaned for the judge stage alone)."""
    import logging

    from core.spark import run_session
    from stages.clean.job import clean
    from stages.clean.window import clean_window

    out, cfg, spark = ctx.layout.clean, ctx.cfg, run_session(ctx.master)
    if ctx.window:
        root = cfg.logs or str(ctx.layout.logs)
        logging.getLogger("dssm.flow").info("window %s..%s of %s", ctx.window[0], ctx.window[-1], root)
        days = ctx.layout.clean_days
        held_out = ctx.test_day
        job = lambda: clean_window(spark, root, ctx.window, days, out, cfg.clean, ctx.force, held_out)  # noqa: E731
        return run_data_stage("clean", root, out, job)
    logs = simulate.path if simulate else cfg.logs
    return run_data_stage("clean", logs, out, lambda: clean(spark, logs, out, cfg.clean, ctx.force))
