"""The vocab stage: letter-trigram and word vocabularies (stages/vocab/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, clean: StageOutput) -> StageOutput:
    from core.spark import run_session
    from stages.vocab.job import vocab

    out, spark = ctx.layout.vocab, run_session(ctx.master)
    job = lambda: vocab(spark, Path(clean.path), out, ctx.cfg.vocab, ctx.force)  # noqa: E731
    return run_data_stage("vocab", clean.path, out, job)
