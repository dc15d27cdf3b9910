"""PROTOCOL.md as code: the evaluation subset of a judged set, NDCG@k, MRR, MAP and the paired test.

Every system is scored on the same `EvalSet`; a system's scores for one query are ranked with a
stable sort, so ties keep the judged file's order (§5).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from core.errors import DssmError
from core.judgments import JudgedPair, JudgedSet, JudgedSetSpec
from core.text import is_test_query, norm

CUTOFFS = (1, 3, 10)
REPORTED_DECIMALS = 4  # every mean in a report.json; the gate compares at this precision too
MIN_TITLES = 5  # §4: a query needs at least this many judged titles ...
MIN_DISTINCT_LABELS = 2  # ... and at least this many distinct label values


@dataclass(frozen=True)
class EvalQuery:
    qid: str  # md5 of the normalised query: stable across runs, safe in a TREC run file
    query: str  # as first written in the file
    rows: np.ndarray  # file positions of the judged pairs, ascending (the tie order)
    titles: list[str]
    labels: np.ndarray


@dataclass(frozen=True)
class EvalSet:
    name: str
    sha256: str  # of the judged file
    min_label: float  # bottom of the label scale: rel = label - min_label
    queries: list[EvalQuery]
    all_queries: bool = False
    spec: JudgedSetSpec = field(default_factory=JudgedSetSpec)
    restricted: bool = False  # built from an explicit query list (a dev split)

    @property
    def split(self) -> str:
        return "dev" if self.restricted else "all" if self.all_queries else "test"

    @property
    def n_pairs(self) -> int:
        return sum(len(q.titles) for q in self.queries)

    def pairs(self) -> tuple[list[str], list[str]]:
        """Queries and titles of every judged pair, query by query: the order scores come back in."""
        queries = [q.query for q in self.queries for _ in q.titles]
        titles = [t for q in self.queries for t in q.titles]
        return queries, titles

    def split_scores(self, scores: np.ndarray) -> list[np.ndarray]:
        """Per-query slices of a flat score vector aligned with `pairs()`."""
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != (self.n_pairs,):
            raise DssmError(f"expected {self.n_pairs} scores, got shape {scores.shape}")
        if not np.isfinite(scores).all():
            raise DssmError(f"{int((~np.isfinite(scores)).sum())} scores are not finite")
        return np.split(scores, np.cumsum([len(q.titles) for q in self.queries])[:-1])


def build_eval_set(
    pairs: list[JudgedPair],
    name: str,
    sha256: str,
    all_queries: bool = False,
    min_label: float | None = None,
    spec: JudgedSetSpec | None = None,
    only: set[str] | None = None,
) -> EvalSet:
    """§3-§4: group by norm(query); keep test queries (or every query, or the normalised queries in
    `only`) with enough varied judgments."""
    groups: dict[str, list[JudgedPair]] = {}
    for p in pairs:
        key = norm(p.query)
        if key:
            groups.setdefault(key, []).append(p)
    queries = []
    for key, group in groups.items():
        if only is not None and key not in only:
            continue
        if only is None and not all_queries and not is_test_query(key):
            continue
        labels = np.array([p.label for p in group])
        if len(group) < MIN_TITLES or len(np.unique(labels)) < MIN_DISTINCT_LABELS:
            continue
        queries.append(
            EvalQuery(
                qid=hashlib.md5(key.encode("utf-8")).hexdigest()[:16],
                query=group[0].query,
                rows=np.array([p.row for p in group]),
                titles=[p.title for p in group],
                labels=labels,
            )
        )
    if not queries:
        which = "queries" if all_queries else "test queries"
        raise DssmError(
            f"{name}: no {which} with at least {MIN_TITLES} judged titles and {MIN_DISTINCT_LABELS} distinct labels"
        )
    bottom = min(p.label for p in pairs) if min_label is None else min_label
    return EvalSet(name, sha256, float(bottom), queries, all_queries, spec or JudgedSetSpec(), only is not None)


def load_eval_set(judged: JudgedSet, all_queries: bool = False, min_label: float | None = None) -> EvalSet:
    """The evaluation set of a resolved judged set (PROTOCOL.md §3 split unless all_queries)."""
    return build_eval_set(judged.pairs(), judged.name, judged.sha256, all_queries, min_label, judged.spec)


def ranking(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score; ties keep file order (§5)."""
    return np.argsort(-scores, kind="stable")


def ndcg(labels: np.ndarray, scores: np.ndarray, k: int, min_label: float) -> float:
    gains = 2.0 ** (labels - min_label) - 1.0
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    top = gains[ranking(scores)][:k]
    ideal = np.sort(gains)[::-1][:k]
    idcg = float(ideal @ discounts[: len(ideal)])
    return float(top @ discounts[: len(top)]) / idcg if idcg > 0 else 0.0


def pairs_in_order(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray | None = None) -> float | None:
    """Of the pairs with different labels (and, with `groups`, in different groups), the share ranked
    in the labels' order (ties in score keep file order, as `ranking`): Kendall's concordance with
    the grades, or None where no pair counts."""
    order = ranking(scores)
    ranked = labels[order]
    above = ranked[:, None] - ranked[None, :]  # [i, j]: label of the i-th ranked − label of the j-th
    counted = np.triu(np.ones(above.shape, dtype=bool), k=1)
    if groups is not None:
        counted &= groups[order][:, None] != groups[order][None, :]
    right, wrong = int(np.sum((above > 0) & counted)), int(np.sum((above < 0) & counted))
    return right / (right + wrong) if right + wrong else None


def reciprocal_rank_and_ap(relevant: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """RR and average precision of one ranking, given a boolean relevance per pair."""
    hits = relevant[ranking(scores)]
    positions = np.flatnonzero(hits) + 1
    if len(positions) == 0:
        return 0.0, 0.0
    precision = np.arange(1, len(positions) + 1) / positions
    return 1.0 / positions[0], float(precision.mean())


@dataclass
class SystemResult:
    """One system on one EvalSet: per-query values (kept for tests and plots) and their means."""

    system: str
    scores: list[np.ndarray]
    per_query: dict[str, np.ndarray]  # "ndcg@1", ..., "rr", "ap" → one value per query (NaN: no relevant pair)

    def mean(self, metric: str) -> float:
        """Mean over queries ×100, as PROTOCOL.md reports it (RR/AP over queries with a relevant pair)."""
        return 100.0 * float(np.nanmean(self.per_query[metric]))


def evaluate_scores(
    eval_set: EvalSet, system: str, scores: np.ndarray, relevant_at: float | None = None
) -> SystemResult:
    """Per-query NDCG@1/3/10, RR and AP of a flat score vector aligned with `eval_set.pairs()`."""
    threshold = relevant_threshold(eval_set) if relevant_at is None else relevant_at
    per_query: dict[str, list[float]] = {f"ndcg@{k}": [] for k in CUTOFFS} | {"rr": [], "ap": []}
    split = eval_set.split_scores(scores)
    for q, s in zip(eval_set.queries, split, strict=True):
        for k in CUTOFFS:
            per_query[f"ndcg@{k}"].append(ndcg(q.labels, s, k, eval_set.min_label))
        relevant = q.labels >= threshold
        rr, ap = reciprocal_rank_and_ap(relevant, s) if relevant.any() else (np.nan, np.nan)
        per_query["rr"].append(rr)
        per_query["ap"].append(ap)
    return SystemResult(system, split, {m: np.array(v) for m, v in per_query.items()})


def relevant_threshold(eval_set: EvalSet) -> float:
    """Default label threshold for MRR/MAP: three quarters up the scale (Home Depot: 2.5 on 1..3)."""
    top = max(float(q.labels.max()) for q in eval_set.queries)
    return eval_set.min_label + 0.75 * (top - eval_set.min_label)


def paired_test(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t-test p-value of per-query values a against b (1.0 when identical)."""
    diff = np.asarray(a) - np.asarray(b)
    if np.allclose(diff, 0):
        return 1.0
    return float(stats.ttest_rel(a, b).pvalue)


def confidence_halfwidth(values: np.ndarray) -> float:
    """Half-width of the 95% t confidence interval of the mean, on the ×100 scale."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return 0.0
    return 100.0 * float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


def metric_key(metric: str) -> str:
    """An MLflow metric name for a report's metric (MLflow allows no '@'): ndcg@10 -> ndcg_at_10."""
    return metric.replace("@", "_at_")
