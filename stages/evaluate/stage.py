"""The evaluate stage: the trained models against the baselines (stages/evaluate/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.artifacts import read_manifest
from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, train: list[StageOutput], negatives: StageOutput, judge: StageOutput | None) -> StageOutput:
    """`dssm evaluate` of the trained models (and their hybrids with BM25, fit on the validation
    queries of the negatives) against the baselines; its report.json is the flow's report. The judged
    set is the run's, or the one the judge stage graded from the logs' clicks."""
    from core.config import field_values
    from core.judgments import CLICK_RELEVANT, CLICK_SCALE, judged_set
    from stages.evaluate.config import EvaluateSettings
    from stages.evaluate.job import EvaluateConfig, evaluate

    out, section = ctx.layout.evaluate, ctx.cfg.evaluate
    judged = judged_set(ctx.judged, judge.path if judge else None)
    checkpoints = [t.path for t in train]
    settings = EvaluateSettings(**field_values(section, EvaluateSettings))
    reports: list[dict[str, Any]] = []

    def job() -> dict[str, Any]:
        cfg = EvaluateConfig(
            judgments=judged,
            out=out,
            models=checkpoints,
            settings=settings,
            hybrid_dev=Path(negatives.path) if section.hybrid else None,
            mlflow_uri=ctx.mlflow_uri,
            force=ctx.force,
            # the scale's, not the set's lowest and highest grades: a night whose grades miss an end scores alike
            min_label=CLICK_SCALE[0] if judged.graded_from == "clicks" else None,
            relevant_at=CLICK_RELEVANT if judged.graded_from == "clicks" else None,
        )
        reports.append(evaluate(cfg))
        return read_manifest(out) | {"skipped": bool(reports[0].get("skipped"))}

    stage = run_data_stage("evaluate", ", ".join(checkpoints), out, job)
    stage.counts = {"queries": reports[0]["eval_queries"], "pairs": reports[0]["eval_pairs"]}
    return stage
