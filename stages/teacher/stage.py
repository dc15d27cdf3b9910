"""The teacher stage: one teacher list per train query, to distil (stages/teacher/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.teacher.config import TeacherConfig


def run(
    ctx: RunContext,
    settings: TeacherConfig,
    rows: StageOutput,
    clean: StageOutput,
    earlier_index: StageOutput | None,
) -> StageOutput:
    """The training rows (the pipeline hands the mined ones when the mine stage ran) with one teacher list
    per train query: candidates from BM25 and the index an earlier run left, scored by the teacher."""
    from stages.teacher.job import teacher

    index = Path(earlier_index.path) if earlier_index is not None else None

    def build() -> dict[str, Any]:
        titles = Path(clean.path) / "titles"
        return teacher(Path(rows.path), titles, index, ctx.layout.output("teacher"), settings, ctx.force)

    return run_data_stage("teacher", rows.path, ctx.layout.output("teacher"), build)
