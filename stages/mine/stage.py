"""The mine stage: hard negatives in place of some sampled ones (stages/mine/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.mine.config import MineConfig


def run(
    ctx: RunContext,
    settings: MineConfig,
    negatives: StageOutput,
    clean: StageOutput,
    earlier_index: StageOutput | None,
) -> StageOutput:
    """The negatives with a share mined from the index an earlier run left (last night's champion's), or
    with BM25 over the title pool where there is none yet."""
    from stages.mine.job import mine

    out, cfg = ctx.layout.mine, settings
    index = Path(earlier_index.path) if earlier_index is not None else None

    def build() -> dict[str, Any]:
        return mine(Path(negatives.path), Path(clean.path) / "titles", index, out, cfg, ctx.force)

    return run_data_stage("mine", negatives.path, out, build)
