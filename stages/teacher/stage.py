"""The teacher stage: one teacher list per train query, to distil (stages/teacher/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage


def run(
    ctx: RunContext,
    negatives: StageOutput,
    clean: StageOutput,
    mine: StageOutput | None,
    earlier_index: StageOutput | None,
) -> StageOutput:
    """The training rows (mined ones when the mine stage ran) with one teacher list per train query:
    candidates from BM25 and the index an earlier run left, scored by the teacher."""
    from stages.teacher.job import teacher

    rows = mine or negatives
    index = Path(earlier_index.path) if earlier_index is not None else None

    def build() -> dict[str, Any]:
        titles = Path(clean.path) / "titles"
        return teacher(Path(rows.path), titles, index, ctx.layout.output("teacher"), ctx.cfg.teacher, ctx.force)

    return run_data_stage("teacher", rows.path, ctx.layout.output("teacher"), build)
