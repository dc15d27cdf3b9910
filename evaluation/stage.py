"""The evaluation stages: evaluate (the trained models against the baselines, evaluation/evaluate.py),
register (evaluation/register.py) and gate (evaluation/gate.py)."""

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
    from evaluation.config import EvaluateSettings
    from evaluation.evaluate import EvaluateConfig, evaluate
    from jobs.judge.config import CLICK_RELEVANT, CLICK_SCALE, judged_set

    out, section = ctx.layout.evaluate, ctx.cfg.evaluate
    judged = judged_set(ctx.judged, judge)
    checkpoints = [t.path for t in train]
    settings = EvaluateSettings(**field_values(section, EvaluateSettings))
    settings.retrieval = settings.retrieval or ctx.cfg.gate.metric != "ndcg@10"  # the gate compares what it measured
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


def register(ctx: RunContext, evaluate: StageOutput) -> StageOutput:
    """`dssm register` of the evaluated models: MLflow models, versions of dssm-DATASET."""
    from evaluation.register import register as register_models

    out = ctx.layout.output("register")
    run_date = ctx.window[-1] if ctx.window else ""
    job = lambda: register_models(Path(evaluate.path), out, run_date, ctx.force)  # noqa: E731
    return run_data_stage("register", evaluate.path, out, job)


def gate(ctx: RunContext, register: StageOutput) -> StageOutput:
    """`dssm gate` of the registered versions: the champion alias moves to a better one."""
    from evaluation.gate import gate as champion_gate

    out = ctx.layout.output("gate")
    job = lambda: champion_gate(Path(register.path), out, ctx.cfg.gate, ctx.force)  # noqa: E731
    return run_data_stage("gate", register.path, out, job)
