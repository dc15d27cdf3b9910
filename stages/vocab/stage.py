"""The vocab stage: letter-trigram and word vocabularies (stages/vocab/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage
from stages.vocab.config import VocabConfig


def run(ctx: RunContext, settings: VocabConfig, clean: StageOutput) -> StageOutput:
    from core.spark import run_session
    from stages.vocab.job import vocab

    out, spark = ctx.layout.vocab, run_session(ctx.master)
    job = lambda: vocab(spark, Path(clean.path), out, settings, ctx.force)  # noqa: E731
    return run_data_stage("vocab", clean.path, out, job)
