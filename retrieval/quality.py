"""Full-catalogue retrieval quality: each query ranks every title, not just its judged ones.

A query's judged titles carry their labels; every title it has no judgment for counts as not
relevant (gain 0). That under-counts a system that finds relevant titles nobody judged, and it is
the same for every system compared. NDCG@10 uses PROTOCOL.md §5's gains (2^(label - min) - 1) with
the ideal ranking of the query's judged titles; Recall@k counts the titles with label >= the
relevance threshold (evaluation.protocol.relevant_threshold) found in the top k; queries with no such
title are left out of recall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.text import norm
from evaluation.protocol import EvalSet


def judged_labels(eval_set: EvalSet) -> dict[str, dict[str, float]]:
    """qid -> {normalised title: label}; a title judged twice for a query keeps its higher label."""
    out: dict[str, dict[str, float]] = {}
    for q in eval_set.queries:
        labels = out.setdefault(q.qid, {})
        for title, label in zip(q.titles, q.labels, strict=True):
            key = norm(title)
            labels[key] = max(float(label), labels.get(key, float("-inf")))
    return out


def catalogue_metrics(
    eval_set: EvalSet, retrieved: dict[str, list[str]], threshold: float, recall_at: tuple[int, ...] = (10, 100)
) -> dict[str, Any]:
    """Mean NDCG@10 and Recall@k (×100) of ranked title lists (qid -> normalised titles, best first),
    and `per_query`: each query's NDCG@10 in eval-set order (for a paired test)."""
    judged = judged_labels(eval_set)
    ndcgs, recalls = [], {k: [] for k in recall_at}
    for q in eval_set.queries:
        labels = judged[q.qid]
        ranked = retrieved.get(q.qid, [])
        gains = np.array([2 ** (labels.get(t, eval_set.min_label) - eval_set.min_label) - 1 for t in ranked[:10]])
        discounts = 1 / np.log2(np.arange(2, 12))
        ideal = np.sort(2 ** (np.array(list(labels.values())) - eval_set.min_label) - 1)[::-1][:10]
        idcg = float((ideal * discounts[: len(ideal)]).sum())
        ndcgs.append(float((gains * discounts[: len(gains)]).sum()) / idcg if idcg > 0 else 0.0)
        relevant = {t for t, label in labels.items() if label >= threshold}
        if relevant:
            for k in recall_at:
                recalls[k].append(len(relevant.intersection(ranked[:k])) / len(relevant))
    out = {"ndcg@10": 100 * float(np.mean(ndcgs))}
    out |= {f"recall@{k}": 100 * float(np.mean(v)) if v else 0.0 for k, v in recalls.items()}
    out["recall_queries"] = len(recalls[recall_at[0]])
    return out | {"per_query": ndcgs}
