"""Did a model learn the production ranker's promotion (`dssm simulate --promotion`) as relevance?

    .venv/bin/python benchmarks/promoted_at_top.py --report bench-work/hd-promo1/ablation-dev \
        --negatives bench-work/hd-promo1/negatives-listwise-map-debiased

Reads the TREC run files and qrels of a `dssm evaluate` report (`runs/*.run`, `qrels.txt`; a
docno is the pair's row in the judged file) and, over the queries whose judged titles include
both promoted and unpromoted brands (`jobs.simulate.promoted_brand`; with `--promoted-brands
weakest`, the train queries' `jobs.simulate.weakest_brands`, as the simulator chose them), prints per
system the share whose first-ranked title is promoted, and the same share for the human grades
(ties among the top-graded titles counted at their promoted fraction). The grades' share is the
unbiased reference: a system well above it ranks promoted brands up for being promoted. Beside it, the
share of differently graded pairs of a promoted and an unpromoted title that the system ranks in the
grades' order (`evaluation.protocol.pairs_in_order` over those pairs, averaged over the queries):
whether un-learning the promotion puts those pairs in the true order.

With `--negatives DIR` (a `dssm negatives --list-size K` output; repeatable), it also prints the mean
error of the list targets of the training queries' judged titles against the simulator's true
attractiveness (`jobs.simulate.attractiveness` of the mean label), for promoted and unpromoted
brands apart: unbiased targets have the same error for both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from debias_targets import mean_labels
from homedepot_table4 import HOME_DEPOT, read_qrels, read_run

from core.judgments import read_judgments
from evaluation.protocol import pairs_in_order
from jobs.simulate import PROMOTED_BRANDS, ClickModel, attractiveness, promotion_rule, split_judgments


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT, help="the judged set the report scored")
    p.add_argument("--report", type=Path, required=True, help="a `dssm evaluate --out` directory")
    p.add_argument("--negatives", type=Path, action="append", default=[], help="a negatives output with lists")
    p.add_argument(
        "--promoted-brands",
        choices=PROMOTED_BRANDS,
        default="hashed",
        help="the log's `dssm simulate --promoted-brands`",
    )
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")
    pairs = read_judgments(args.judgments)

    labels = read_qrels(args.report)
    is_promoted = promotion_rule(split_judgments(pairs)[0], args.promoted_brands)
    promoted = {row: is_promoted(pairs[int(row)].title) for rows in labels.values() for row in rows}
    mixed = sorted(q for q, rows in labels.items() if 0 < sum(promoted[r] for r in rows) < len(rows))

    print(f"\n{len(mixed)} of {len(labels)} queries judge both promoted and unpromoted brands\n")
    print("| ranked by | promoted title first | pairs mixing brands in the grades' order |\n|---|---|---|")
    print(f"| grades | {100 * np.mean([grades_share(labels[q], promoted) for q in mixed]):.1f}% | 100% |")
    for run in sorted((args.report / "runs").glob("*.run")):
        ranked = read_run(args.report, run.stem)
        first = np.mean([promoted[ranked[q][0]] for q in mixed])
        in_order = [mixed_pairs_in_order(ranked[q], labels[q], promoted) for q in mixed]
        in_order_mean = np.mean([share for share in in_order if share is not None])
        print(f"| {run.stem} | {100 * first:.1f}% | {100 * in_order_mean:.2f}% |")
    if args.negatives:
        print("\n| list targets | promoted: titles, mean error | unpromoted: titles, mean error | difference |")
        print("|---|---|---|---|")
    judged = mean_labels(pairs) if args.negatives else {}
    for negatives in args.negatives:
        errors = target_errors(negatives, judged, is_promoted)
        promo, other = errors[True], errors[False]
        print(
            f"| {negatives.name} | {len(promo):,}, {np.mean(promo):+.4f} | {len(other):,}, {np.mean(other):+.4f} "
            f"| {np.mean(promo) - np.mean(other):+.4f} |"
        )


def target_errors(
    negatives: Path, labels: dict[tuple[str, str], float], is_promoted: Callable[[str], bool]
) -> dict[bool, list[float]]:
    """List target − true attractiveness of every judged listed title of the training split, by promotion."""
    low, high = min(labels.values()), max(labels.values())
    model = ClickModel()
    errors: dict[bool, list[float]] = {True: [], False: []}
    for path in sorted((negatives / "train").glob("*.parquet")):
        table = pq.read_table(path, columns=["query", "shown", "relevance"])
        for query, shown, targets in zip(*(table[c].to_pylist() for c in table.column_names), strict=True):
            for title, target in zip(shown or [], targets or [], strict=True):
                if (query, title) in labels:
                    truth = attractiveness(np.float64((labels[query, title] - low) / (high - low)), model)
                    errors[is_promoted(title)].append(target - float(truth))
    return errors


def mixed_pairs_in_order(ranked: list[str], labels: dict[str, float], promoted: dict[str, bool]) -> float | None:
    """Of a query's differently graded pairs of a promoted and an unpromoted title, the share ranked
    in the grades' order: where the promotion can mislead a model, and only there."""
    grades = np.array([labels[row] for row in ranked])
    brands = np.array([promoted[row] for row in ranked])
    return pairs_in_order(grades, -np.arange(len(ranked), dtype=float), groups=brands)


def grades_share(labels: dict[str, float], promoted: dict[str, bool]) -> float:
    """The promoted fraction of a query's top-graded titles: its share at the top when ties break at random."""
    best = max(labels.values())
    return float(np.mean([promoted[row] for row, label in labels.items() if label == best]))


if __name__ == "__main__":
    main()
