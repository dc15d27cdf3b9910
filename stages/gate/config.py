"""The gate stage's settings (`dssm gate`'s flags; the flow's `gate` section, GateStageConfig), in a module
that imports no pyspark, mlflow or torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.errors import DssmError

GateMetric = Literal["", "ndcg@10", "retrieval_ndcg@10"]
DEFAULT_METRIC = "ndcg@10"  # a registered model's first gate, when none is named


@dataclass(frozen=True)
class GateConfig:
    # what the champion gate compares: ndcg@10 (re-ranking the judged titles), or retrieval_ndcg@10
    # (ranking the whole catalogue, what the index serves to dssm search; the evaluation must have measured it);
    # "": the metric the registered model's last gate compared (ndcg@10 the first time)
    metric: GateMetric = ""
    # nightly runs: warn when the night's best model scores below the median of the last `trend_nights` nights'
    # best on the same evaluation set by more than `decline_tolerance` (points of the metric, 0-100)
    trend_nights: int = 5
    decline_tolerance: float = 0.5


@dataclass(frozen=True)
class GateStageConfig(GateConfig):
    """The flow's `gate` section: it compares full-catalogue retrieval NDCG@10 by default, what the index
    stage serves to dssm search and the search service."""

    metric: GateMetric = "retrieval_ndcg@10"


def check_config(cfg: GateConfig) -> None:
    if cfg.trend_nights < 0 or not cfg.decline_tolerance >= 0:
        raise DssmError("gate: need trend_nights >= 0 and decline_tolerance >= 0")
