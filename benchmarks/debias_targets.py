"""Do the listwise targets of `dssm negatives` order each query's shown titles like the human grades?

    .venv/bin/python benchmarks/debias_targets.py --workdir bench-work/hd-biased \\
        --biased negatives-listwise-ctr --debiased negatives-listwise-debiased

Reads two `dssm negatives --list-size K` outputs of one clean log: one built without `--debias`
(targets = click-through rates) and one with it (clicks / expected examinations). For every query
with both lists, it ranks the titles both hold three ways, by examination (the list's order:
the production ranker's average order), by CTR and by the debiased relevance, and scores each
ranking with NDCG@1/3/10 (PROTOCOL.md §5's definition) against the judged labels of the titles
(a shown title not judged for the query is one of the simulator's random fillers, of relevance 0:
it gets the lowest label).
This measures the targets alone, before any model; the ablation (`homedepot_ablation.py`) measures
the models trained on them.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from homedepot_table4 import HOME_DEPOT

from core.judgments import JudgedPair, read_judgments
from core.text import norm
from evaluation.protocol import CUTOFFS, ndcg, paired_test


def mean_labels(pairs: Iterable[JudgedPair]) -> dict[tuple[str, str], float]:
    """The mean label of every judged (query, title), both normalised as the clean log has them."""
    labels: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pair in pairs:
        labels[norm(pair.query), norm(pair.title)].append(pair.label)
    return {pair: float(np.mean(values)) for pair, values in labels.items()}


def lists(negatives: Path) -> dict[str, tuple[list[str], np.ndarray]]:
    """query -> (shown titles, targets) of every row that carries a list, train and valid."""
    out = {}
    for split in ("train", "valid"):
        for r in pq.read_table(negatives / split, columns=["query", "shown", "relevance"]).to_pylist():
            if r["shown"]:
                out[r["query"]] = (r["shown"], np.array(r["relevance"]))
    return out


def score_orders(
    orders: Iterable[tuple[np.ndarray, dict[str, np.ndarray]]], min_label: float
) -> dict[str, dict[int, list[float]]]:
    """NDCG@k (PROTOCOL.md §5) against the labels of each (labels, {name: scores}) list, per name;
    lists whose labels are all equal are left out (every order is ideal)."""
    scores: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for labels, by_name in orders:
        if labels.max() == labels.min():
            continue
        for name, s in by_name.items():
            for k in CUTOFFS:
                scores[name][k].append(ndcg(labels, s, k, min_label))
    return scores


def print_scores(scores: dict[str, dict[int, list[float]]], pairs: Iterable[tuple[str, str]]) -> None:
    """The mean NDCG of each order, then the paired difference of each (a, b) in `pairs`."""
    print("| titles ordered by | " + " | ".join(f"NDCG@{k}" for k in CUTOFFS) + " |")
    print("|---|" + "---|" * len(CUTOFFS))
    for name in scores:
        print(f"| {name} | " + " | ".join(f"{100 * np.mean(scores[name][k]):.2f}" for k in CUTOFFS) + " |")
    for a_name, b_name in pairs:
        for k in CUTOFFS:
            a, b = np.array(scores[a_name][k]), np.array(scores[b_name][k])
            print(f"{a_name} − {b_name} NDCG@{k}: {100 * (a.mean() - b.mean()):+.2f} (p={paired_test(a, b):.3g})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd-biased"))
    p.add_argument("--biased", default="negatives-listwise-ctr", help="negatives built without --debias")
    p.add_argument("--debiased", default="negatives-listwise-debiased", help="negatives built with --debias")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")

    grades = mean_labels(read_judgments(args.judgments))
    min_label = min(grades.values())
    biased, debiased = lists(args.workdir / args.biased), lists(args.workdir / args.debiased)
    orders = []
    for query, (listed, targets) in sorted(debiased.items()):
        if query not in biased:
            continue
        ctr = dict(zip(biased[query][0], biased[query][1], strict=True))
        keep = [i for i, t in enumerate(listed) if t in ctr]  # the lists' top K differ a little in their tail
        titles, relevance = [listed[i] for i in keep], targets[keep]
        # titles shown but not judged for the query are the simulator's fillers, of relevance 0
        labels = np.array([grades.get((query, t), min_label) for t in titles])
        ranker = -np.arange(len(titles), dtype=float)
        orders.append((labels, {"ranker": ranker, "ctr": np.array([ctr[t] for t in titles]), "debiased": relevance}))
    scores = score_orders(orders, min_label)
    used = len(scores["ranker"][CUTOFFS[0]])
    print(
        f"\n{used} queries with both lists and labels that differ among their common titles ({len(debiased)} lists)\n"
    )
    print_scores(scores, [("debiased", "ctr")])


if __name__ == "__main__":
    main()
