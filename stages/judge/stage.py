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
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from core.artifacts import altered, amend_manifest, read_manifest
from core.errors import DssmError
from core.stage import RunContext, StageOutput, run_data_stage
from stages.judge.config import JudgeConfig

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("dssm.flow")


def run(ctx: RunContext, settings: JudgeConfig, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """Grade the clean stage's impressions (of the test day, under the time split) by their clicks
    (over the propensity stage's expected examinations with `judge.debias`), or keep the set an earlier
    night graded; evaluate and analyze then read this judged set."""
    from core.spark import run_session
    from stages.judge.job import judge

    cfg, out = settings, ctx.layout.output("judge")
    kept = kept_set(ctx, cfg, out)
    # the run decided its test day before clean ran (held_out_day): judge/ must not have changed since
    if kept is not None:
        kept_day = str(read_manifest(out).get("test_day", ""))
    else:  # a new set: tonight's last day under the time split
        kept_day = ctx.window[-1] if ctx.test_day else ""
    if kept_day != ctx.test_day:
        raise DssmError(f"{out} changed while this run ran (its test day is not {ctx.test_day or 'none'}): run again")
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
        if ctx.test_day and not test_day:  # the time split's fallback: kept as such for its nights
            split["fallback"] = True
        amend_manifest(out, {"built_on": ctx.window[-1]} | split)
    return graded


def prepare(ctx: RunContext, settings: JudgeConfig) -> RunContext:
    """The flow's hook before any stage runs: the run's held-out test day, which clean leaves out of
    training and this stage grades from."""
    return replace(ctx, test_day=held_out_day(ctx, settings))


def split_of(ctx: RunContext, cfg: JudgeConfig) -> str:
    """The split a windowed night grades its set by: judge.split, but "query" for a one-day window (the
    time split would leave training no day)."""
    return "time" if cfg.split == "time" and len(ctx.window) > 1 else "query"


def held_out_day(ctx: RunContext, cfg: JudgeConfig) -> str:
    """The test day of the evaluation set this windowed night uses under the time split: the day the kept
    set was graded from, or the window's last day when tonight grades a new one; "" under the query split."""
    if not ctx.window or split_of(ctx, cfg) != "time":
        if ctx.window and cfg.split == "time":
            log.info("judge.split=time needs a window of two days or more: a one-day night uses the query split")
        return ""
    out = ctx.layout.output("judge")
    if kept_set(ctx, cfg, out, quiet=True) is not None:
        return str(read_manifest(out).get("test_day", ""))
    day = ctx.window[-1]
    if trained_on := _champion_trained_on(ctx, day):
        log.warning(
            "judge: %s, the day a new set would be graded from (a rerun of this night, or a backfill): tonight's "
            "set is graded on the query split, whose test queries no model trained on; the next night grades "
            "one on the time split",
            trained_on,
        )
        return ""
    return day


def _champion_trained_on(ctx: RunContext, day: str) -> str:
    """Why the champion (the model the gate compares with, and the warm start's) may have trained on `day`:
    it was trained on a night whose window reached `day` (its `run_date` tag); "" when it was not, or there
    is none. A set graded from that day would score the champion on its own training traffic."""
    from mlflow.exceptions import MlflowException

    from core.tracking import client
    from scoring.serving import CHAMPION, registered_name

    name = registered_name(ctx.judged.name)
    try:
        runs = client(ctx.mlflow_uri)
        champion = runs.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # nothing registered yet
        return ""
    trained_to = champion.tags.get("run_date", "") or _last_day_trained_on(runs, champion.run_id)
    if trained_to is None:  # registered by hand, or before run dates: it may have trained on any day
        undated = "no run date, nor days its training run read"
        return f"champion v{champion.version} of {name} ({undated}) may have trained on {day}"
    if trained_to < day:
        return ""
    return f"champion v{champion.version} of {name} trained on a window up to {trained_to}, which covers {day}"


def _last_day_trained_on(runs: MlflowClient, evaluation_run: str) -> str | None:
    """The last dt= partition the training run behind a registered version read (its dataset inputs, which
    the clean stage's log_to_training_runs logs), from the version's evaluation run; None when none is named."""
    import re

    try:
        trained = runs.get_run(evaluation_run).data.tags.get("train_run_id", "")
        inputs = runs.get_run(trained).inputs.dataset_inputs if trained else []
    except Exception:  # a run deleted, or a version logged elsewhere
        return None
    days = [m.group(1) for d in inputs if (m := re.search(r"dt=(\d{4}-\d{2}-\d{2})", d.dataset.name))]
    return max(days) if days else None


def kept_set(ctx: RunContext, cfg: JudgeConfig, out: Path, quiet: bool = False) -> StageOutput | None:
    """The judged set an earlier night graded into `out`, when this windowed night is still within its
    `keep_nights`, and it is intact and graded with this config and split (a time-split night keeps a
    set that fell back to the query split: its test day had no logs); else None (grade anew). `quiet`:
    decide without logging why (the run's first look, before its stages)."""
    from stages.judge.config import grading

    if not ctx.window or cfg.keep_nights <= 1 or ctx.force:
        return None
    manifest = read_manifest(out)
    if not manifest or manifest.get("stage") != "judge" or not manifest.get("built_on"):
        return None
    say = (lambda *a: None) if quiet else log.warning
    built_on, split = manifest["built_on"], manifest.get("split", "query")
    fell_back = split == "query" and manifest.get("fallback") and split_of(ctx, cfg) == "time"
    why = ""
    if manifest.get("params") != grading(cfg):
        why = "it was graded with other judge settings"
    elif split != split_of(ctx, cfg) and not fell_back:
        why = f"it was graded on the {split} split ({'before judge.split existed; ' if 'split' not in manifest else ''}"
        why += f"this night's: {split_of(ctx, cfg)})"
    elif problem := altered(out, manifest):
        why = f"it is damaged ({problem})"
    if why:
        say("judge: the judged set of %s is not kept, %s: grading a new one, a new evaluation series", built_on, why)
        return None
    age = (date.fromisoformat(ctx.window[-1]) - date.fromisoformat(built_on)).days
    if not 0 <= age < cfg.keep_nights:
        if not quiet and age < 0:  # a backfill: a night before the one that graded the set
            log.info("judge: the judged set was graded on %s, after this night: graded anew, in its place", built_on)
        elif not quiet:
            log.info("judge: the judged set of %s is %d nights old; grading a new one", built_on, age)
        return None
    if not quiet:
        log.info("judge: keeping the judged set graded on %s (night %d of %d)", built_on, age + 1, cfg.keep_nights)
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
