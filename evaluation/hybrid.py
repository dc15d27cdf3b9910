"""The hybrid system: a trained model's cosine fused with BM25, its one weight fit on dev queries.

score(q, t) = cos(q, t) + w · bm25(q, t). The score of a pair depends on that pair alone (no
per-query normalisation), so the same model serves re-ranking and, later, retrieval. `w` is chosen
on the validation queries of `dssm negatives` (train-split queries the model never trained on) by
the mean of NDCG@1/3/10, never on test queries. Grid: `RATIOS` times std(cos)/std(bm25) over the
dev pairs, so the grid spans both scales whatever the judged set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from evaluation.lexical import BM25
from evaluation.protocol import CUTOFFS, EvalSet, evaluate_scores
from evaluation.systems import Scorer

log = logging.getLogger(__name__)
RATIOS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class HybridScorer:
    def __init__(self, model: Scorer, bm25: BM25, weight: float):
        self.model, self.bm25, self.weight = model, bm25, weight

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return fuse(self.model.score(queries, titles), self.bm25.score(queries, titles), self.weight)


def fuse(model_scores: np.ndarray, bm25_scores: np.ndarray, weight: float) -> np.ndarray:
    return np.asarray(model_scores, dtype=np.float64) + weight * np.asarray(bm25_scores, dtype=np.float64)


@dataclass(frozen=True)
class Fit:
    weight: float
    ratio: float
    dev_queries: int
    dev_objective: float  # mean NDCG@1/3/10 (×100) of the chosen weight on the dev queries
    grid: dict[float, float]  # ratio → dev objective

    def params(self) -> dict[str, float]:
        return {
            "fusion_weight": self.weight,
            "fusion_ratio": self.ratio,
            "fit_dev_queries": self.dev_queries,
            "fit_dev_objective": round(self.dev_objective, 3),
            "fit_dev_grid": " ".join(f"{r:g}:{v:.2f}" for r, v in self.grid.items()),  # ratio:objective
        }


def fit_weight(dev: EvalSet, model: Scorer, bm25: BM25) -> Fit:
    """The fusion weight with the best mean dev NDCG@1/3/10; ties go to the smaller weight."""
    queries, titles = dev.pairs()
    m, b = np.asarray(model.score(queries, titles), dtype=np.float64), bm25.score(queries, titles)
    scale = float(m.std() / b.std()) if b.std() > 0 else 0.0
    grid = {}
    for ratio in RATIOS:
        result = evaluate_scores(dev, "hybrid", fuse(m, b, ratio * scale))
        grid[ratio] = float(np.mean([result.mean(f"ndcg@{k}") for k in CUTOFFS]))
    best = max(grid, key=lambda r: (grid[r], -r))
    log.info("hybrid: fusion ratio %.2f (dev mean NDCG %.2f; model alone %.2f)", best, grid[best], grid[0.0])
    return Fit(best * scale, best, len(dev.queries), grid[best], grid)
