"""The hybrid system: a model's score fused with other scorers' (BM25, MiniLM, other trained
models), the weights fit on dev queries.

score(q, t) = s_0(q, t) + Σ_i w_i · s_i(q, t), s_0 the model's cosine. The score of a pair depends on
that pair alone (no per-query normalisation), so the same model serves re-ranking and, later,
retrieval. The weights are chosen on the validation queries of `dssm negatives` (train-split
queries the model never trained on) by the mean of NDCG@1/3/10, never on test queries. Grid per
partner: `RATIOS` times std(s_0)/std(s_i) over the dev pairs, so it spans both scales whatever the
judged set; with several partners, coordinate ascent over them (ROUNDS passes; one pass for one).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from core.errors import DssmError
from scoring.protocol import CUTOFFS, EvalSet, evaluate_scores

log = logging.getLogger(__name__)
RATIOS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
ROUNDS = 2  # coordinate-ascent passes over the partners (one suffices for one partner)


class HybridScorer:
    """s_0 + Σ w_i·s_i over aligned pairs: `model` scores s_0, `partners[i]` s_i."""

    def __init__(self, model: Scorer, partners: Sequence[Scorer], weights: Sequence[float]):
        if len(partners) != len(weights):
            raise ValueError(f"{len(partners)} partners but {len(weights)} weights")
        self.model, self.partners, self.weights = model, list(partners), [float(w) for w in weights]

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return fuse(self.model.score(queries, titles), [p.score(queries, titles) for p in self.partners], self.weights)


def fuse(model_scores: np.ndarray, partner_scores: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    out = np.asarray(model_scores, dtype=np.float64).copy()
    for w, s in zip(weights, partner_scores, strict=True):
        out += w * np.asarray(s, dtype=np.float64)
    return out


class Scorer(Protocol):
    """Anything that scores (query, title) pairs: BM25, an embedder, a hybrid."""

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class Fit:
    weights: tuple[float, ...]  # one per partner
    ratios: tuple[float, ...]
    dev_queries: int
    dev_objective: float  # mean NDCG@1/3/10 (×100) of the chosen weights on the dev queries
    alone: float  # the model alone on the same objective
    grid: dict[float, float]  # the last partner's ratio -> dev objective (the whole grid with one partner)

    def params(self) -> dict[str, object]:
        return {
            "fusion_weights": " ".join(f"{w:.6g}" for w in self.weights),
            "fusion_ratios": " ".join(f"{r:g}" for r in self.ratios),
            "fit_dev_queries": self.dev_queries,
            "fit_dev_objective": round(self.dev_objective, 3),
            "fit_dev_model_alone": round(self.alone, 3),
        }


def _objective(dev: EvalSet, scores: np.ndarray) -> float:
    result = evaluate_scores(dev, "hybrid", scores)
    return float(np.mean([result.mean(f"ndcg@{k}") for k in CUTOFFS]))


def fit_weights(dev: EvalSet, model: Scorer, partners: Sequence[Scorer]) -> Fit:
    """The partners' weights with the best mean dev NDCG@1/3/10; ties go to the smaller weight."""
    queries, titles = dev.pairs()
    m = np.asarray(model.score(queries, titles), dtype=np.float64)
    scored = [np.asarray(p.score(queries, titles), dtype=np.float64) for p in partners]
    scales = [float(m.std() / s.std()) if s.std() > 0 else 0.0 for s in scored]
    ratios = [0.0] * len(partners)
    alone = best_value = _objective(dev, m)
    grid: dict[float, float] = {}
    for _ in range(ROUNDS if len(partners) > 1 else 1):
        for i in range(len(partners)):
            grid = {}
            for ratio in RATIOS:
                trial = [*ratios[:i], ratio, *ratios[i + 1 :]]
                grid[ratio] = _objective(dev, fuse(m, scored, [r * s for r, s in zip(trial, scales, strict=True)]))
            ratios[i] = max(grid, key=lambda r: (grid[r], -r))
            best_value = grid[ratios[i]]
    weights = tuple(r * s for r, s in zip(ratios, scales, strict=True))
    log.info("hybrid: fusion ratios %s (dev mean NDCG %.2f; model alone %.2f)", ratios, best_value, alone)
    return Fit(weights, tuple(ratios), len(dev.queries), best_value, alone, grid)


KINDS = ("model", "bm25", "minilm", "checkpoint")
PARTNER_FILE = re.compile(r"component-\d+\.pt")  # a trained partner's checkpoint beside model.pt


def fusion_components(fusion: dict) -> tuple[list[dict], list[float]]:
    """A fusion.json's components ({name, kind[, file]}, the model first) and the re-ranking weights of
    the ones after it, checked (a fusion.json is a file anyone who reaches the registry can edit). One
    saved before components existed is the model and BM25, with its `weight`."""
    if "components" not in fusion:
        return [{"name": "model", "kind": "model"}, {"name": "bm25", "kind": "bm25"}], [float(fusion["weight"])]
    components, weights = fusion["components"], fusion.get("weights")
    problem = None
    if not isinstance(components, list) or not components or not isinstance(weights, list):
        problem = "components and weights must be lists"
    elif len(weights) != len(components) - 1:
        problem = f"{len(weights)} weights for {len(components) - 1} components after the model"
    elif [c.get("kind") for c in components if isinstance(c, dict)][:1] != ["model"]:
        problem = "the first component must be the model"
    elif any(not isinstance(c, dict) or c.get("kind") not in KINDS[1:] for c in components[1:]):
        problem = f"each component after the model is one of {', '.join(KINDS[1:])}"
    elif len({c.get("name") for c in components}) != len(components):
        problem = "component names repeat"
    elif any(c["kind"] == "checkpoint" and not PARTNER_FILE.fullmatch(str(c.get("file", ""))) for c in components):
        problem = "a trained partner's file must be component-N.pt"
    elif any(c["kind"] == "bm25" for c in components) and not isinstance(fusion.get("bm25"), dict):
        problem = "a BM25 component needs the bm25 statistics"
    if problem:
        raise DssmError(f"fusion.json: {problem}")
    return list(components), [float(w) for w in weights]


def load_components(
    fusion: dict, model: Scorer, files: dict[str, Path], remember: bool = True, device: str = "cpu"
) -> dict[str, Scorer]:
    """The scorers a saved hybrid fuses, by component name, its model (already loaded) first: BM25 from
    the saved statistics, MiniLM from the bundled weights, a trained partner from its checkpoint
    (`files`: a component's file name -> where it is now). Nothing here unpickles: checkpoints load as
    tensors and data (modeling/checkpoint.py). `remember=False`: MiniLM keeps no vectors (a served retriever);
    the embedders run on `device`."""
    from scoring.lexical import BM25
    from scoring.neural import MiniLMEmbedder, TwoTowerEmbedder

    components, _ = fusion_components(fusion)
    out: dict[str, Scorer] = {}
    for c in components:
        kind = c["kind"]
        if kind == "model":
            out[c["name"]] = model
        elif kind == "bm25":
            out[c["name"]] = BM25.from_dict(fusion["bm25"])
        elif kind == "minilm":
            out[c["name"]] = MiniLMEmbedder(device, remember=remember)
        elif kind == "checkpoint" and c.get("file") in files:
            out[c["name"]] = TwoTowerEmbedder(files[c["file"]], device)
        else:
            raise DssmError(
                f"fusion component {c.get('name')!r}: unknown kind {kind!r} or file {c.get('file')!r} missing"
            )
    return out
