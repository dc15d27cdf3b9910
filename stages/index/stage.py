"""The index stage: the champion's ANN index over the catalogue, for `dssm search` (stages/index/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.index.config import IndexConfig


def run(ctx: RunContext, settings: IndexConfig, clean: StageOutput, gate: StageOutput) -> StageOutput:
    """`dssm index` of the champion the gate left (its registered model's alias) over `index.catalogue`
    (default: the clean stage's title pool), logged as its retriever."""
    from core.spark import run_session
    from scoring.serving import CHAMPION, read_gate, registered_name
    from stages.index.job import index

    out = ctx.layout.index
    decisions = read_gate(Path(gate.path))
    model = decisions[0]["model"] if decisions else registered_name(ctx.judged.name)
    champion = f"models:/{model}@{CHAMPION}"
    titles = Path(settings.catalogue or clean.path)

    def job() -> dict[str, Any]:
        return index(run_session(ctx.master), champion, titles, out, ctx.mlflow_uri, settings, True, ctx.force)

    return run_data_stage("index", champion, out, job)
