"""Full-catalogue retrieval in `dssm evaluate` (PROTOCOL.md §8): every system that can rank a
catalogue ranks all the judged file's distinct titles for each query, beside the re-ranking table.

BM25 ranks with bm25s (retrieval/bm25.py); a two-tower model, MiniLM and doc2vec with exact inner
product of unit vectors; a hybrid (MODEL+bm25) fuses the model's and BM25's candidates with the
`RetrievalFusion` chosen here on the dev queries over the same catalogue (retrieval/fusion.py), which
its MLflow model and `dssm search` then serve. ULM and PLSA score pairs only, and doc2vec would
infer a vector per catalogue title (minutes for 53k): they are left out.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from core.text import norm
from evaluation.protocol import EvalSet, paired_test
from evaluation.systems import System
from retrieval.bm25 import CatalogueBM25, best
from retrieval.fusion import RetrievalFusion, fuse_candidates, ranked, union
from retrieval.quality import DEPTH, METRICS, catalogue_metrics
from retrieval.retriever import unit_rows

log = logging.getLogger(__name__)
REFERENCE = "bm25"
# The dev grid of a hybrid's retrieval fusion; ties go to the earlier entry (zscore, the middle alpha).
GRID = [
    RetrievalFusion(method, depth, alpha)
    for method, depth, alpha in itertools.product(("zscore", "rrf"), (100, 200, 500), (0.5, 0.4, 0.6, 0.3, 0.7))
]


class Catalogue:
    """The titles every query ranks (normalised, first-seen order), their BM25 index and, per model,
    their unit vectors (computed once per evaluation)."""

    def __init__(self, titles: list[str]):
        self.titles = titles
        self.bm25 = CatalogueBM25(titles)
        self._vectors: dict[Any, np.ndarray] = {}

    @classmethod
    def of_judged(cls, pairs) -> Catalogue:
        return cls(list(dict.fromkeys(norm(p.title) for p in pairs)))

    def vectors(self, embed) -> np.ndarray:
        key = getattr(embed, "__self__", embed)  # the model behind a bound method: one entry per model
        if key not in self._vectors:
            self._vectors[key] = unit_rows(embed(self.titles, "doc"))
        return self._vectors[key]


def embedding(scorer) -> Any | None:
    """`embed(texts, tower)` of a system's model (a hybrid's model part), or None for pair scorers."""
    model = getattr(scorer, "model", None) if hasattr(scorer, "bm25") else scorer  # HybridScorer: its model
    if model is None or not hasattr(model, "embed"):
        return None
    if hasattr(model, "tokenizer"):  # a two-tower model: a tower each
        return model.embed
    return lambda texts, tower="query": model.embed(texts)


def dense(catalogue: Catalogue, embed, queries: list[str], depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query vectors, top `depth` title ids, their cosines) by exact inner product."""
    import faiss

    vectors = catalogue.vectors(embed)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    query_vectors = unit_rows(embed(queries, "query"))
    cos, ids = index.search(query_vectors, min(depth, len(catalogue.titles)))
    return query_vectors, ids, cos


def lexical(catalogue: Catalogue, queries: list[str], depth: int) -> list[np.ndarray]:
    return [catalogue.bm25.search(q, min(depth, len(catalogue.titles)))[0] for q in queries]


def hybrid(
    catalogue: Catalogue, embed, queries: list[str], fusions: list[RetrievalFusion], out_depth: int, weight: float = 0.0
) -> dict[RetrievalFusion, list[np.ndarray]]:
    """Each fusion's top `out_depth` title ids per query; candidate scores are computed once."""
    deepest = max(f.depth for f in fusions)
    query_vectors, model_ids, _ = dense(catalogue, embed, queries, deepest)
    title_vectors = catalogue.vectors(embed)
    out: dict[RetrievalFusion, list[np.ndarray]] = {f: [] for f in fusions}
    for query, vector, ids in zip(queries, query_vectors, model_ids, strict=True):
        bm25 = catalogue.bm25.scores(query)
        by_bm25 = best(bm25, deepest)
        for fusion in fusions:
            candidates = union(ids[: fusion.depth], by_bm25[: fusion.depth], bm25[by_bm25[: fusion.depth]])
            cos = title_vectors[candidates] @ vector
            out[fusion].append(ranked(candidates, fuse_candidates(cos, bm25[candidates], fusion, weight), out_depth)[0])
    return out


def fit_fusion(dev: EvalSet, catalogue: Catalogue, embed, threshold: float) -> tuple[RetrievalFusion, dict[str, float]]:
    """The grid's fusion with the best strict NDCG@10 on the dev queries; returns it and the grid."""
    queries = [q.query for q in dev.queries]
    runs = hybrid(catalogue, embed, queries, GRID, 10)
    grid = {}
    for fusion, ids in runs.items():
        retrieved = {q.qid: [catalogue.titles[i] for i in row] for q, row in zip(dev.queries, ids, strict=True)}
        grid[fusion] = catalogue_metrics(dev, retrieved, threshold)["ndcg@10"]
    best = max(GRID, key=lambda f: grid[f])  # max keeps the first of equals: the grid's order
    log.info("retrieval fusion: %s (dev NDCG@10 %.2f over %d queries)", best, grid[best], len(queries))
    return best, {f"{f.method}/{f.depth}/{f.alpha:g}": round(v, 3) for f, v in grid.items()}


def rankings(system: System, catalogue: Catalogue, queries: list[str]) -> list[np.ndarray] | None:
    """The system's top DEPTH title ids per query; None when it cannot rank a catalogue."""
    if system.name == REFERENCE:
        return lexical(catalogue, queries, DEPTH)
    embed = embedding(system.scorer) if system.name != "doc2vec" else None
    if embed is None:
        return None
    if system.kind == "hybrid":
        fusion = RetrievalFusion.from_dict((system.fusion or {}).get("retrieval"))
        return hybrid(catalogue, embed, queries, [fusion], DEPTH, (system.fusion or {}).get("weight", 0.0))[fusion]
    return list(dense(catalogue, embed, queries, DEPTH)[1])


def evaluate_retrieval(
    eval_set: EvalSet, catalogue: Catalogue, systems: list[System], threshold: float
) -> dict[str, Any]:
    """report.json's `retrieval` section: each system's §8 metrics and p-values against BM25, with
    the per-query values (`per_query`, in the order of `qids`) that write_report moves to a file of
    their own."""
    queries = [q.query for q in eval_set.queries]
    measured: dict[str, dict[str, Any]] = {}
    for system in systems:
        ids = rankings(system, catalogue, queries)
        if ids is None:
            log.info("retrieval: %s scores pairs only; not measured", system.name)
            continue
        retrieved = {q.qid: [catalogue.titles[i] for i in row] for q, row in zip(eval_set.queries, ids, strict=True)}
        measured[system.name] = catalogue_metrics(eval_set, retrieved, threshold)
        shown = ", ".join(f"{m} {measured[system.name][m]:.1f}" for m in METRICS)
        log.info("retrieval %-10s %s", system.name, shown)
    reference = measured.get(REFERENCE, {}).get("per_query")
    out: dict[str, Any] = {}
    for name, metrics in measured.items():
        per_query = metrics.pop("per_query")
        entry = {m: round(v, 4) if isinstance(v, float) else v for m, v in metrics.items()}
        if reference is not None and name != REFERENCE:
            entry["p_vs_bm25"] = {m: _paired(per_query[m], reference[m]) for m in METRICS}
        entry["per_query"] = {m: [None if np.isnan(v) else float(v) for v in per_query[m]] for m in METRICS}
        out[name] = entry
    qids = [q.qid for q in eval_set.queries]
    return {"catalogue_titles": len(catalogue.titles), "queries": len(queries), "qids": qids, "systems": out}


def _paired(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)  # recall leaves out queries without a relevant title
    return paired_test(a[keep], b[keep])
