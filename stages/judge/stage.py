"""The judge stage: a judged set graded from the logs' clicks, when logs come without one (stages/judge/job.py).

In a windowed run the set a night grades is kept for `judge.keep_nights` nights: the nights evaluate,
gate and plot their models on one evaluation set (one eval key, one gate-history series), and its test
queries stay out of training as every night's do (PROTOCOL.md §3's split). The night after, a new set is
graded from that night's window.
"""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path

from core.artifacts import altered, amend_manifest, read_manifest
from core.stage import RunContext, StageOutput, run_data_stage

log = logging.getLogger("dssm.flow")


def run(ctx: RunContext, clean: StageOutput, propensity: StageOutput | None) -> StageOutput:
    """Grade the clean stage's impressions by their clicks (over the propensity stage's expected
    examinations with `judge.debias`), or keep the set an earlier night graded; evaluate and analyze
    then read this judged set."""
    from core.spark import run_session
    from stages.judge.job import judge

    cfg, out = ctx.cfg.judge, ctx.layout.output("judge")
    kept = kept_set(ctx, out)
    if kept is not None:
        return kept
    spark = run_session(ctx.master)
    curve = Path(propensity.path) if propensity is not None else None
    job = lambda: judge(spark, Path(clean.path), out, cfg, ctx.force, curve)  # noqa: E731
    graded = run_data_stage("judge", clean.path, out, job)
    if ctx.window and not (read_manifest(out) or {}).get("built_on"):  # the night it was graded: its age
        amend_manifest(out, {"built_on": ctx.window[-1]})
    return graded


def kept_set(ctx: RunContext, out: Path) -> StageOutput | None:
    """The judged set an earlier night graded into `out`, when this windowed night is still within its
    `keep_nights` and it is intact and graded with this config; else None (grade anew)."""
    cfg = ctx.cfg.judge
    if not ctx.window or cfg.keep_nights <= 1 or ctx.force:
        return None
    manifest = read_manifest(out)
    if not manifest or manifest.get("stage") != "judge" or not manifest.get("built_on"):
        return None
    from dataclasses import asdict

    same = {k: v for k, v in manifest.get("params", {}).items() if k != "keep_nights"}
    if same != {k: v for k, v in asdict(cfg).items() if k != "keep_nights"} or altered(out, manifest):
        return None
    age = (date.fromisoformat(ctx.window[-1]) - date.fromisoformat(manifest["built_on"])).days
    if not 0 <= age < cfg.keep_nights:
        log.info("judge: the judged set of %s is %d nights old; grading a new one", manifest["built_on"], age)
        return None
    log.info("judge: keeping the judged set graded on %s (night %d of %d)", manifest["built_on"], age + 1,
             cfg.keep_nights)  # fmt: skip
    return StageOutput.of_manifest("judge", out, manifest | {"skipped": True})
