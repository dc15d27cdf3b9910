"""Full-catalogue retrieval quality (PROTOCOL.md §8): each query ranks every title, not just its judged ones.

A query's judged titles carry their labels (a title judged twice keeps its higher label); every
title it has no judgment for counts as not relevant (gain 0). That under-counts a system that finds
relevant titles nobody judged, the same for every system compared, so two more numbers say how much:
judged@10, the share of the top 10 the judges saw, and condensed NDCG@10 (Sakai 2007), NDCG@10 of the
ranking with its unjudged titles removed. NDCG uses PROTOCOL.md §5's gains (2^(label - min) - 1) and
the ideal ranking of the query's judged titles; Recall@k counts the titles with label >= the
relevance threshold (scoring.protocol.relevant_threshold) found in the top k, over the queries
that have such a title.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.text import norm
from scoring.protocol import EvalSet

RECALL_AT = (10, 100, 1000)
METRICS = ("ndcg@10", *(f"recall@{k}" for k in RECALL_AT), "judged@10", "condensed_ndcg@10")
DEPTH = max(RECALL_AT)  # titles a system retrieves per query to be measured
_DISCOUNTS = 1 / np.log2(np.arange(2, 12))


def judged_labels(eval_set: EvalSet) -> dict[str, dict[str, float]]:
    """qid -> {normalised title: label}; a title judged twice for a query keeps its higher label."""
    out: dict[str, dict[str, float]] = {}
    for q in eval_set.queries:
        labels = out.setdefault(q.qid, {})
        for title, label in zip(q.titles, q.labels, strict=True):
            key = norm(title)
            labels[key] = max(float(label), labels.get(key, float("-inf")))
    return out


def ndcg10(ranked: list[str], labels: dict[str, float], min_label: float) -> float:
    gains = np.array([2 ** (labels.get(t, min_label) - min_label) - 1 for t in ranked[:10]])
    ideal = np.sort(2 ** (np.array(list(labels.values())) - min_label) - 1)[::-1][:10]
    idcg = float((ideal * _DISCOUNTS[: len(ideal)]).sum())
    return float((gains * _DISCOUNTS[: len(gains)]).sum()) / idcg if idcg > 0 else 0.0


def catalogue_metrics(eval_set: EvalSet, retrieved: dict[str, list[str]], threshold: float) -> dict[str, Any]:
    """The §8 metrics (×100) of ranked title lists (qid -> normalised titles, best first), and
    `per_query`: metric -> one value per query in eval-set order (NaN where recall has no relevant
    title), for paired tests."""
    judged = judged_labels(eval_set)
    per_query: dict[str, list[float]] = {m: [] for m in METRICS}
    for q in eval_set.queries:
        labels, ranked = judged[q.qid], retrieved.get(q.qid, [])
        per_query["ndcg@10"].append(ndcg10(ranked, labels, eval_set.min_label))
        per_query["judged@10"].append(sum(t in labels for t in ranked[:10]) / 10)
        per_query["condensed_ndcg@10"].append(ndcg10([t for t in ranked if t in labels], labels, eval_set.min_label))
        relevant = {t for t, label in labels.items() if label >= threshold}
        for k in RECALL_AT:
            found = len(relevant.intersection(ranked[:k])) / len(relevant) if relevant else np.nan
            per_query[f"recall@{k}"].append(found)
    arrays = {m: np.array(v, dtype=np.float64) for m, v in per_query.items()}
    out: dict[str, Any] = {m: 100 * float(np.nanmean(v)) if np.isfinite(v).any() else 0.0 for m, v in arrays.items()}
    out["recall_queries"] = int(np.isfinite(arrays["recall@10"]).sum())
    return out | {"per_query": arrays}
