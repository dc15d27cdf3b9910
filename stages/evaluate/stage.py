"""The evaluate stage: the trained models against the baselines (stages/evaluate/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.artifacts import read_manifest
from core.stage import RunContext, StageOutput, run_data_stage
from stages.evaluate.config import EvaluateConfig, EvaluateStageConfig


def run(
    ctx: RunContext,
    settings: EvaluateStageConfig,
    train: list[StageOutput],
    negatives: StageOutput,
    judge: StageOutput | None,
) -> StageOutput:
    """`dssm evaluate` of the trained models (and their hybrids with BM25, fit on the validation
    queries of the negatives) against the baselines; its report.json is the flow's report. The judged
    set is the run's, or the one the judge stage graded from the logs' clicks."""
    from core.config import field_values
    from core.judgments import CLICK_RELEVANT, CLICK_SCALE, judged_set
    from stages.evaluate.job import EvaluateJob, evaluate

    out = ctx.layout.evaluate
    judged = judged_set(ctx.judged, judge.path if judge else None)
    checkpoints = [t.path for t in train]
    scored = EvaluateConfig(**field_values(settings, EvaluateConfig))
    reports: list[dict[str, Any]] = []

    def job() -> dict[str, Any]:
        cfg = EvaluateJob(
            judgments=judged,
            out=out,
            models=checkpoints,
            settings=scored,
            hybrid_dev=Path(negatives.path) if settings.hybrid else None,
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


def report(output: StageOutput) -> dict[str, Any]:
    """The flow's hook after the walk: the evaluation's report (PROTOCOL.md §6) is report.json's body."""
    from stages.evaluate.job import read_report

    report = read_report(Path(output.path)) | {"seconds": round(output.seconds, 1)}
    return report | ({"skipped": True} if output.skipped else {})
