"""How a hybrid ranks the whole catalogue: the candidates of several scorers, fused per query.

A hybrid is a list of scorers (its `components`): the trained model first, then any of BM25, the
bundled all-MiniLM-L6-v2 (`minilm`) and other trained models. Re-ranking judged titles fuses with
s_0 + Σ w_i·s_i (scoring/hybrid.py): one score per pair, the weights fit for re-ranking.
Retrieving from a catalogue is a different task, and PROTOCOL.md §8's reference shows it: a plain
z-score fusion beats that re-scoring by 4.6 NDCG@10 points. So a hybrid also carries a
`RetrievalFusion`, chosen on the dev queries over the same catalogue (scoring/catalogue.py): the
union of every component's top `depth` titles (BM25's with a matching word), each candidate with
every component's score, fused by
- `zscore`: Σ w_i·z(s_i), each score standardised over the query's candidates;
- `rrf`: reciprocal-rank fusion, Σ w_i/(60 + rank by s_i) (Cormack et al. 2009);
- `rescore`: the re-ranking fusion's s_0 + Σ w_i·s_i (what `dssm search` served before).
A weight of 0 leaves a component's candidates in the union but not in the score.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

FusionMethod = Literal["zscore", "rrf", "rescore"]
RRF_K = 60  # Cormack et al.'s constant
LEXICAL = "bm25"  # the component name of BM25
PRETRAINED = "minilm"  # the component name of the bundled all-MiniLM-L6-v2, off the shelf


@dataclass(frozen=True)
class RetrievalFusion:
    method: FusionMethod = "zscore"
    depth: int = 200  # candidates taken from each component's ranking
    weights: tuple[float, ...] = (0.5, 0.5)  # one per component, in the hybrid's order (zscore, rrf)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "depth": self.depth, "weights": list(self.weights)}

    @property
    def label(self) -> str:
        """method/depth/w1:w2:... as the dev grid's keys read."""
        return f"{self.method}/{self.depth}/" + ":".join(f"{w:g}" for w in self.weights)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RetrievalFusion:
        """The fusion a hybrid's fusion.json names. One saved before it existed re-scores as it did;
        one saved with a two-way `alpha` (the model's share) has weights (alpha, 1 - alpha)."""
        if not d:
            return cls(method="rescore", depth=100)
        weights = d.get("weights")
        if weights is None:
            alpha = float(d.get("alpha", 0.5))
            weights = (alpha, 1 - alpha)
        return cls(d.get("method", "zscore"), int(d.get("depth", 200)), tuple(float(w) for w in weights))


def weight_grid(components: int) -> list[tuple[float, ...]]:
    """Every weighting of `components` scorers on a simplex grid (steps of 1/10 for two, 1/12 for three:
    equal thirds, halves and quarters; 1/(2n) beyond), the model's weight > 0, nearest to equal
    weights first (so that ties on dev go to the most even mix)."""
    units = {2: 10, 3: 12}.get(components, 2 * components)
    points = [
        tuple(round(c / units, 10) for c in combo)
        for combo in itertools.product(range(units + 1), repeat=components)
        if sum(combo) == units and combo[0] > 0
    ]
    even = 1 / components
    return sorted(points, key=lambda w: (round(sum((x - even) ** 2 for x in w), 10), [-x for x in w]))


def standardised(x: np.ndarray) -> np.ndarray:
    """(x − mean) / sd over one query's candidates (all zeros when they are equal)."""
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def _ranks(x: np.ndarray) -> np.ndarray:
    """1 for the highest score; ties by candidate order."""
    order = np.argsort(-x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    return ranks


def fuse_scores(
    scores: Sequence[np.ndarray], fusion: RetrievalFusion, rescore_weights: Sequence[float] = ()
) -> np.ndarray:
    """Fused scores of one query's candidates from each component's scores of them (the model's first;
    `rescore_weights`: the re-ranking weights of the components after it, used by `rescore` only)."""
    scores = [np.asarray(s, dtype=np.float64) for s in scores]
    if fusion.method == "rescore":
        return scores[0] + sum(w * s for w, s in zip(rescore_weights, scores[1:], strict=True))
    if len(fusion.weights) != len(scores):
        raise ValueError(f"fusion {fusion.label} has {len(fusion.weights)} weights for {len(scores)} scorers")
    if fusion.method == "zscore":
        return sum(w * standardised(s) for w, s in zip(fusion.weights, scores, strict=True))
    return sum(w / (RRF_K + _ranks(s)) for w, s in zip(fusion.weights, scores, strict=True))


def union(*tops: np.ndarray) -> np.ndarray:
    """Every id of the candidate lists, each once, in the order first seen (the first list's, then
    the ones each later list adds)."""
    if not tops:
        return np.zeros(0, np.int64)
    joined = np.concatenate([np.asarray(t, dtype=np.int64) for t in tops])
    _, first = np.unique(joined, return_index=True)
    return joined[np.sort(first)]


def fuse_query(
    tops: Sequence[np.ndarray],
    score: Callable[[int, np.ndarray], np.ndarray],
    fusion: RetrievalFusion,
    k: int,
    rescore_weights: Sequence[float] = (),
    depth: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One query's best k catalogue ids and fused scores: the union of each component's top `depth`
    (default `fusion.depth`; `tops[i]`, best first; BM25's holding only titles with a matching word),
    each candidate scored by every component (`score(i, ids)`), fused as `fusion` says."""
    candidates = union(*(t[: depth or fusion.depth] for t in tops))
    fused = fuse_scores([score(i, candidates) for i in range(len(tops))], fusion, rescore_weights)
    return ranked(candidates, fused, k)


def ranked(candidates: np.ndarray, fused: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k candidates and their fused scores, best first (ties: candidate order)."""
    order = np.argsort(-fused, kind="stable")[:k]
    return candidates[order], fused[order]
