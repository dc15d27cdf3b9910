"""Evaluation settings the run config names without loading the evaluation: the gate's metric."""

from __future__ import annotations

from typing import Literal

GateMetric = Literal["ndcg@10", "retrieval_ndcg@10"]
