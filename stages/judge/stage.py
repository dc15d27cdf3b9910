"""The judge stage: a judged set graded from the logs' clicks, when logs come without one (stages/judge/job.py).

In a windowed run the set a night grades is kept for `judge.keep_nights` nights: the nights evaluate,
gate and plot their models on one evaluation set (one eval key, one gate-history series). Its test
queries (PROTOCOL.md §3's split) stay out of training as every night's do. With `judge.split=time` (the
default) it is graded from the window's last day alone, the test day, which the stages that training
reads leave out for as long as the set is in use (the clean stage sums the window without it): the set
is traffic that no model under test trained on. The night after the last of `keep_nights`, a new set
is graded from that night's last day.
"""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path

from core.artifacts import altered, amend_manifest, read_manifest
from core.stage import RunContext, StageOutput, run_data_stage

log = logging.getLogger("dssm.flow")


def run(ctx: RunContext, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """Grade the clean stage's impressions (of the test day, under the time split) by their clicks
    (over the propensity stage's expected examinations with `judge.debias`), or keep the set an earlier
    night graded; evaluate and analyze then read this judged set."""
    from core.spark import run_session
    from stages.judge.job import judge

    cfg, out = ctx.cfg.judge, ctx.layout.output("judge")
    kept = kept_set(ctx, out)
    if kept is not None:
        return kept
    test_day = _test_day_output(ctx, Path(clean.path)) if ctx.test_day else None
    source = test_day or Path(clean.path)
    spark = run_session(ctx.master)
    curve = Path(propensity.path) if propensity is not None else None
    job = lambda: judge(spark, source, out, cfg, ctx.force, curve)  # noqa: E731
    graded = run_data_stage("judge", source, out, job)
    if ctx.window and not (read_manifest(out) or {}).get("built_on"):  # the night it was graded: its age
        split = {"split": "time", "test_day": ctx.test_day} if test_day else {"split": "query"}
        amend_manifest(out, {"built_on": ctx.window[-1]} | split)
    return graded


def split_of(ctx: RunContext) -> str:
    """The split a windowed night grades its set by: judge.split, but "query" for a one-day window (the
    time split would leave training no day)."""
    return "time" if ctx.cfg.judge.split == "time" and len(ctx.window) > 1 else "query"


def held_out_day(ctx: RunContext) -> str:
    """The test day of the evaluation set this windowed night uses under the time split: the day the kept
    set was graded from, or the window's last day when tonight grades a new one; "" under the query split."""
    if not ctx.window or split_of(ctx) != "time":
        if ctx.window and ctx.cfg.judge.split == "time":
            log.warning("judge.split=time needs a window of two days or more: this one-day night uses the query split")
        return ""
    out = ctx.layout.output("judge")
    return str(read_manifest(out).get("test_day", "")) if kept_set(ctx, out) is not None else ctx.window[-1]


def kept_set(ctx: RunContext, out: Path) -> StageOutput | None:
    """The judged set an earlier night graded into `out`, when this windowed night is still within its
    `keep_nights`, and it is intact and graded with this config and split; else None (grade anew)."""
    from stages.judge.config import grading

    cfg = ctx.cfg.judge
    if not ctx.window or cfg.keep_nights <= 1 or ctx.force:
        return None
    manifest = read_manifest(out)
    if not manifest or manifest.get("stage") != "judge" or not manifest.get("built_on"):
        return None
    built_on, split = manifest["built_on"], manifest.get("split", "query")
    if manifest.get("params") != grading(cfg) or split != split_of(ctx):
        log.warning("judge: the judged set of %s was graded with other judge settings or split (%s); grading a new "
                    "one: a new evaluation series starts", built_on, split)  # fmt: skip
        return None
    if problem := altered(out, manifest):
        log.warning("judge: the judged set of %s is damaged (%s); grading a new one: a new evaluation series "
                    "starts", built_on, problem)  # fmt: skip
        return None
    age = (date.fromisoformat(ctx.window[-1]) - date.fromisoformat(manifest["built_on"])).days
    if not 0 <= age < cfg.keep_nights:
        log.info("judge: the judged set of %s is %d nights old; grading a new one", manifest["built_on"], age)
        return None
    log.info("judge: keeping the judged set graded on %s (night %d of %d)", manifest["built_on"], age + 1,
             cfg.keep_nights)  # fmt: skip
    return StageOutput.of_manifest("judge", out, manifest | {"skipped": True})


def _test_day_output(ctx: RunContext, clean: Path) -> Path | None:
    """The clean output of the test day alone, which the clean stage cleaned and left out of the window;
    None when it held nothing out (the test day without logs, or the window's only day with logs): this
    night's set is then graded from the window, on the query split, and the next night's on the time split."""
    held = (read_manifest(clean) or {}).get("held_out") or {}
    if held.get("date") == ctx.test_day:
        return Path(held["path"])
    log.warning(
        "judge: the test day %s was not held out of training (no logs that day, or no other day with logs): "
        "tonight's set is graded from the window's days on the query split",
        ctx.test_day,
    )
    return None
