"""Evaluation settings the run config names without loading the evaluation: the gate's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GateMetric = Literal["ndcg@10", "retrieval_ndcg@10"]


@dataclass(frozen=True)
class GateConfig:
    # what the champion gate compares: ndcg@10 (re-ranking the judged titles), or retrieval_ndcg@10
    # (ranking the whole catalogue, what the index serves to dssm search; the evaluation must have measured it)
    metric: GateMetric = "ndcg@10"


def metric_key(metric: str) -> str:
    """An MLflow metric name for a report's metric (MLflow allows no '@'): ndcg@10 -> ndcg_at_10."""
    return metric.replace("@", "_at_")
