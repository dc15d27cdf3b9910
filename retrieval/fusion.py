"""How a hybrid ranks the whole catalogue: the model's and BM25's candidates, fused per query.

Re-ranking judged titles fuses with cos + w·BM25 (evaluation/hybrid.py): one score per pair, the
weight fit for re-ranking. Retrieving from a catalogue is a different task, and PROTOCOL.md §8's
reference shows it: a plain z-score fusion beats that re-scoring by 4.6 NDCG@10 points. So a hybrid
also carries a `RetrievalFusion`, chosen on the dev queries over the whole catalogue
(evaluation/retrieval.py): the union of the model's and BM25's top `depth` titles, each candidate
with both scores, fused by
- `zscore`: α·z(cos) + (1 − α)·z(bm25), each standardised over the query's candidates;
- `rrf`: reciprocal-rank fusion, α/(60 + rank by cos) + (1 − α)/(60 + rank by BM25) (Cormack et al. 2009);
- `rescore`: the re-ranking fusion's cos + w·BM25 (what `dssm search` served before).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

FusionMethod = Literal["zscore", "rrf", "rescore"]
RRF_K = 60  # Cormack et al.'s constant


@dataclass(frozen=True)
class RetrievalFusion:
    method: FusionMethod = "zscore"
    depth: int = 200  # candidates taken from each of the model's and BM25's rankings
    alpha: float = 0.5  # the model's share (zscore, rrf); BM25 has 1 − alpha

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RetrievalFusion:
        """The fusion a hybrid's fusion.json names; one saved before it existed re-scores as it did."""
        return cls(**d) if d else cls(method="rescore", depth=100)


def _standardised(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def _ranks(x: np.ndarray) -> np.ndarray:
    """1 for the highest score; ties by candidate order."""
    order = np.argsort(-x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    return ranks


def fuse_candidates(cos: np.ndarray, bm25: np.ndarray, fusion: RetrievalFusion, weight: float = 0.0) -> np.ndarray:
    """Fused scores of one query's candidates from their cosines and BM25 scores (`weight`: the
    re-ranking weight, used by `rescore` only)."""
    cos, bm25 = np.asarray(cos, dtype=np.float64), np.asarray(bm25, dtype=np.float64)
    if fusion.method == "zscore":
        return fusion.alpha * _standardised(cos) + (1 - fusion.alpha) * _standardised(bm25)
    if fusion.method == "rrf":
        return fusion.alpha / (RRF_K + _ranks(cos)) + (1 - fusion.alpha) / (RRF_K + _ranks(bm25))
    return cos + weight * bm25


def union(model_ids: np.ndarray, lexical_ids: np.ndarray, lexical_scores: np.ndarray) -> np.ndarray:
    """The model's candidates, then BM25's (those with a matching word) that the model lacks."""
    extra = lexical_ids[lexical_scores > 0]
    return np.concatenate([model_ids, extra[~np.isin(extra, model_ids)]]).astype(np.int64)


def ranked(candidates: np.ndarray, fused: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k candidates and their fused scores, best first (ties: candidate order)."""
    order = np.argsort(-fused, kind="stable")[:k]
    return candidates[order], fused[order]
