"""The analyze stage: what the trained LSTM-RNN reads (stages/analyze/job.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from core.artifacts import read_manifest
from core.stage import RunContext, StageOutput, run_data_stage
from stages.analyze.config import AnalyzeConfig


def run(
    ctx: RunContext, settings: AnalyzeConfig, train: list[StageOutput], judge: StageOutput | None
) -> StageOutput | None:
    """`dssm analyze` of the first recurrent model (against the RNN when one was trained beside it) on
    the judged set's test queries, logged to its training run; None when no recurrent model was trained."""
    from core.judgments import judged_set
    from modeling.checkpoint import read_checkpoint
    from stages.analyze.job import AnalyzeJob, analyze
    from stages.analyze.lstm import RECURRENT

    checkpoints = [t.path for t in train]
    encoders = {c: read_checkpoint(Path(c))["config"]["model"]["encoder"] for c in checkpoints}
    recurrent = [c for c in checkpoints if encoders[c] in RECURRENT]
    if not recurrent:
        trained = ", ".join(sorted(set(encoders.values())))
        logging.getLogger("dssm.flow").info("analyze: no recurrent model among %s; nothing to analyse", trained)
        return None
    main = next((c for c in recurrent if encoders[c] != "rnn"), recurrent[0])
    compare = next((c for c in recurrent if encoders[c] == "rnn" and c != main), None)
    out = ctx.layout.analyze
    judged = judged_set(ctx.judged, judge.path if judge else None)
    cfg = AnalyzeJob(main, out, compare, judgments=judged, settings=settings, force=ctx.force)

    def job() -> dict[str, Any]:
        result = analyze(cfg)
        return read_manifest(out) | {"skipped": bool(result.get("skipped"))}

    return run_data_stage("analyze", main, out, job)
