"""Full-catalogue retrieval in `dssm evaluate` (PROTOCOL.md §8): every system that can rank a
catalogue ranks all the judged file's distinct titles for each query, beside the re-ranking table.

BM25 ranks with bm25s (scoring/bm25.py); a two-tower model and MiniLM with exact inner product of
unit vectors; a hybrid (e.g. lstm+bm25, lstm+bm25+minilm) fuses its components' candidates with the
`RetrievalFusion` chosen here on the dev queries over the same catalogue (scoring/fusion.py), which
its MLflow model and `dssm search` then serve. ULM and PLSA score pairs only, and doc2vec would
infer a vector per catalogue title (minutes for 53k): they are left out.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from core.text import norm
from scoring.bm25 import CatalogueBM25, matching
from scoring.fusion import LEXICAL, RetrievalFusion, fuse_query, union, weight_grid
from scoring.hybrid import Scorer
from scoring.protocol import REPORTED_DECIMALS, EvalSet, paired_test
from scoring.quality import DEPTH, METRICS, catalogue_metrics, judged_labels, ndcg10
from scoring.retriever import unit_rows
from scoring.systems import System

log = logging.getLogger(__name__)
REFERENCE = "bm25"
DEPTHS = (100, 200, 500)  # the dev grid's candidate depths per component; ties go to the earlier (shallower)
METHODS = ("zscore", "rrf")


def fusion_grid(components: int) -> list[RetrievalFusion]:
    """The dev grid of a hybrid's retrieval fusion: each method, depth and weighting (scoring/fusion.py's
    simplex, nearest to equal weights first); ties go to the earlier entry."""
    return [
        RetrievalFusion(method, depth, weights)
        for method, depth, weights in itertools.product(METHODS, DEPTHS, weight_grid(components))
    ]


def catalogue_titles(pairs) -> list[str]:
    """The titles every query ranks: a judged set's distinct titles, normalised, in first-seen order."""
    return list(dict.fromkeys(norm(p.title) for p in pairs))


class Catalogue:
    """The titles every query ranks (normalised, first-seen order), their BM25 index and, per model,
    their unit vectors (computed once per evaluation)."""

    def __init__(self, titles: list[str]):
        self.titles = titles
        self.bm25 = CatalogueBM25(titles)
        self._vectors: dict[Any, np.ndarray] = {}

    @classmethod
    def of_judged(cls, pairs) -> Catalogue:
        return cls(catalogue_titles(pairs))

    def vectors(self, embed) -> np.ndarray:
        key = getattr(embed, "__self__", embed)  # the model behind a bound method: one entry per model
        if key not in self._vectors:
            self._vectors[key] = unit_rows(embed(self.titles, "doc"))
        return self._vectors[key]


def embedding(scorer: Scorer) -> Any | None:
    """`embed(texts, tower)` of a dense scorer (a two-tower model, MiniLM), or None for pair scorers."""
    from scoring.neural import MiniLMEmbedder, TwoTowerEmbedder

    # doc2vec would infer a vector per catalogue title (minutes for 53k): not a catalogue ranker
    return scorer.embed if isinstance(scorer, MiniLMEmbedder | TwoTowerEmbedder) else None


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


class Candidates:
    """Each component's ranking of the catalogue for a list of queries, to `depth`: `tops(q)` its top
    ids per component (BM25's: titles with a matching word), `scores(q, i, ids)` component i's scores of any
    titles. Dense components search once for all queries; BM25 scores the catalogue per query."""

    def __init__(self, catalogue: Catalogue, scorers: dict[str, Scorer], queries: list[str], depth: int):
        self.catalogue, self.names, self.depth = catalogue, list(scorers), min(depth, len(catalogue.titles))
        self.embeds = {n: embedding(s) for n, s in scorers.items() if n != LEXICAL}
        missing = [n for n, e in self.embeds.items() if e is None]
        if missing:
            raise ValueError(f"{', '.join(missing)} cannot rank a catalogue (pair scorers)")
        self.dense = {n: dense(catalogue, e, queries, self.depth) for n, e in self.embeds.items()}
        self._bm25: tuple[int, np.ndarray] | None = None

    def _lexical(self, q: int, query: str) -> np.ndarray:
        if self._bm25 is None or self._bm25[0] != q:
            self._bm25 = (q, self.catalogue.bm25.scores(query))
        return self._bm25[1]

    def tops(self, q: int, query: str) -> list[np.ndarray]:
        out = []
        for name in self.names:
            if name == LEXICAL:
                out.append(matching(self._lexical(q, query), self.depth))
            else:
                out.append(self.dense[name][1][q])
        return out

    def scores(self, q: int, query: str, i: int, ids: np.ndarray) -> np.ndarray:
        name = self.names[i]
        if name == LEXICAL:
            return self._lexical(q, query)[ids]
        return self.catalogue.vectors(self.embeds[name])[ids] @ self.dense[name][0][q]


def fused(
    catalogue: Catalogue,
    scorers: dict[str, Scorer],
    queries: list[str],
    fusion: RetrievalFusion,
    out_depth: int,
    rescore_weights: tuple[float, ...] = (),
) -> list[np.ndarray]:
    """The fusion's top `out_depth` title ids per query (scoring/fusion.py's `fuse_query`, as
    `dssm search` ranks)."""
    found = Candidates(catalogue, scorers, queries, fusion.depth)
    out = []
    for q, query in enumerate(queries):
        tops = found.tops(q, query)
        score = lambda i, ids, q=q, query=query: found.scores(q, query, i, ids)  # noqa: E731
        out.append(fuse_query(tops, score, fusion, out_depth, rescore_weights)[0])
    return out


def fit_fusion(
    dev: EvalSet, catalogue: Catalogue, scorers: dict[str, Scorer]
) -> tuple[RetrievalFusion, dict[str, float]]:
    """The grid's fusion of `scorers` (the model first) with the best strict NDCG@10 on the dev
    queries; returns it and the grid. Each depth's candidates and standardised scores are computed
    once, then every weighting is a matrix product."""
    queries = [q.query for q in dev.queries]
    grid = fusion_grid(len(scorers))
    found = Candidates(catalogue, scorers, queries, max(DEPTHS))
    top10: dict[RetrievalFusion, list[list[str]]] = {f: [] for f in grid}
    for q, query in enumerate(queries):
        tops = found.tops(q, query)
        for depth in DEPTHS:
            candidates = union(*(t[:depth] for t in tops))
            scores = np.stack([found.scores(q, query, i, candidates).astype(np.float64) for i in range(len(tops))])
            sd = scores.std(axis=1, keepdims=True)
            features = {
                "zscore": np.divide(
                    scores - scores.mean(axis=1, keepdims=True), sd, where=sd > 0, out=np.zeros_like(scores)
                ),
                "rrf": 1 / (60 + _rank_rows(scores)),
            }
            for fusion in (f for f in grid if f.depth == depth):
                fused_scores = np.asarray(fusion.weights) @ features[fusion.method]
                order = np.argsort(-fused_scores, kind="stable")[:10]
                top10[fusion].append([catalogue.titles[i] for i in candidates[order]])
    judged = judged_labels(dev)  # once, not per grid point: only NDCG@10 decides
    values = {}
    for fusion, rows in top10.items():
        pairs = zip(dev.queries, rows, strict=True)
        values[fusion] = 100 * float(np.mean([ndcg10(row, judged[q.qid], dev.min_label) for q, row in pairs]))
    chosen = max(grid, key=lambda f: values[f])  # max keeps the first of equals: the grid's order
    log.info("retrieval fusion of %s: %s (dev NDCG@10 %.2f over %d queries)", "+".join(scorers), chosen.label,
             values[chosen], len(queries))  # fmt: skip
    return chosen, {f.label: round(v, 3) for f, v in values.items()}


def _rank_rows(scores: np.ndarray) -> np.ndarray:
    """Per row, 1 for the highest score; ties by candidate order (scoring/fusion.py's ranks)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    ranks = np.empty_like(scores)
    np.put_along_axis(ranks, order, np.arange(1, scores.shape[1] + 1, dtype=np.float64)[None, :], axis=1)
    return ranks


def rankings(system: System, catalogue: Catalogue, queries: list[str]) -> list[np.ndarray] | None:
    """The system's top DEPTH title ids per query; None when it cannot rank a catalogue."""
    if system.name == REFERENCE:
        return lexical(catalogue, queries, DEPTH)
    if system.kind == "hybrid":
        fusion = system.fusion or {}
        retrieval = RetrievalFusion.from_dict(fusion.get("retrieval"))
        rescore = tuple(fusion.get("weights") or [fusion.get("weight", 0.0)])
        return fused(catalogue, system.scorers(), queries, retrieval, DEPTH, rescore)
    embed = embedding(system.scorer)
    if embed is None:
        return None
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
        entry = {m: round(v, REPORTED_DECIMALS) if isinstance(v, float) else v for m, v in metrics.items()}
        if reference is not None and name != REFERENCE:
            entry["p_vs_bm25"] = {m: _paired(per_query[m], reference[m]) for m in METRICS}
        entry["per_query"] = {m: [None if np.isnan(v) else float(v) for v in per_query[m]] for m in METRICS}
        out[name] = entry
    qids = [q.qid for q in eval_set.queries]
    return {"catalogue_titles": len(catalogue.titles), "queries": len(queries), "qids": qids, "systems": out}


def _paired(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)  # recall leaves out queries without a relevant title
    return paired_test(a[keep], b[keep])
