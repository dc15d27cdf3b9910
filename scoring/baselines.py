"""The baselines by name and their parameters, in a module that imports no pyspark, mlflow or torch: the
run config's `evaluate.baselines` is checked against these names (scoring/systems.py builds them)."""

from __future__ import annotations

from dataclasses import dataclass

BASELINES = ("bm25", "doc2vec", "ulm", "plsa", "minilm")


@dataclass(frozen=True)
class BaselineParams:
    k1: float = 1.2
    b: float = 0.75
    mu: float = 100.0  # ULM's Dirichlet prior
    topics: int = 50  # PLSA
    plsa_iterations: int = 30
    seed: int = 0
