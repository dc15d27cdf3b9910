"""Would a prior fitted to the log (empirical Bayes) give better list targets than `map`'s fixed one?

    .venv/bin/python benchmarks/eb_prior.py --lists bench-work/hd-weak2/negatives-map-debiased
    .venv/bin/python benchmarks/eb_prior.py --check   # the fit recovers known priors from simulated clicks

`--lists` is a `dssm negatives --debias --list-size K --list-targets map` output. From its clean
log's impressions and its examination curve (clipped at its `min_propensity`, as the lists were
built), the script fits a Beta(α, β) prior of the PBM's attractiveness γ to every (query, title)
shown, by maximum marginal likelihood: γ integrated on a grid of 200 points, θ held at the curve,
pairs with the same clicks and skips per rank sharing one likelihood. It then orders each query's
listed titles four ways and scores the orders with NDCG against the human grades, as
`debias_targets.py` does:
- `map`: the lists' own targets, the posterior mode under the fixed prior worth `prior_clicks`
  clicks in `prior_clicks + prior_skips` examinations;
- `eb-mean` and `eb-mode`: the posterior mean and mode under the fitted prior;
- `ratio`: clicks over expected examinations, no prior.
This shows whether a prior fitted to the log itself orders the titles the listwise loss is trained
on better than the fixed one, chosen on earlier logs' dev queries (docs/training.md). About 100 s
and 1.7 GB of memory for 1M impressions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from debias_targets import lists, mean_labels, print_scores, score_orders
from homedepot_table4 import HOME_DEPOT
from scipy.optimize import minimize
from scipy.special import betainc, logsumexp

from core.artifacts import require_manifest
from core.judgments import read_judgments
from jobs.negatives import examination_curve
from jobs.propensity import shown_cells
from jobs.spark import get_spark

EDGES = np.linspace(0.0, 1.0, 201)
GRID = (EDGES[1:] + EDGES[:-1]) / 2  # γ's grid: midpoints of 200 equal bins of (0, 1)


def rank_counts(clean: Path) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The (query, title) pairs shown in `clean/impressions`, and per pair its clicks and its skips
    (shown, not clicked) at each rank 1..R, R the lowest rank shown: two arrays of R columns. The
    cells are `dssm propensity`'s own (`jobs.propensity.shown_cells`)."""
    spark = get_spark()
    cells = shown_cells(spark.read.parquet(str(clean / "impressions"))).toPandas()
    cells["skips"] = cells["shown"] - cells["clicks"]
    per_rank = cells.pivot_table(
        index=["query", "title"], columns="rank", values=["clicks", "skips"], aggfunc="sum", fill_value=0
    )
    ranks = range(1, int(cells["rank"].max()) + 1)
    clicks, skips = (per_rank[v].reindex(columns=ranks, fill_value=0).to_numpy(np.float64) for v in ("clicks", "skips"))
    return per_rank.index.to_frame(index=False), clicks, skips


def log_likelihoods(clicks: np.ndarray, skips: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """log P(clicks, skips | γ) on the grid, one row per pair (per-rank counts), up to a constant of
    θ alone: under the PBM a click at rank k has probability θ_k·γ and a skip 1 − θ_k·γ."""
    return clicks.sum(axis=1)[:, None] * np.log(GRID)[None, :] + skips @ np.log1p(-np.outer(theta, GRID))


def fit_prior(clicks: np.ndarray, skips: np.ndarray, theta: np.ndarray) -> tuple[float, float]:
    """The Beta(α, β) maximising Σ log ∫ Beta(γ; α, β) P(clicks, skips | γ) dγ over the pairs (rows
    of per-rank counts), on the grid."""
    # the likelihood depends on the total clicks and the per-rank skips alone: one per distinct row
    counts, weight = np.unique(np.column_stack([clicks.sum(axis=1), skips]), axis=0, return_counts=True)
    loglik = log_likelihoods(counts[:, :1], counts[:, 1:], theta)

    def nll(params: np.ndarray) -> float:
        return -float(weight @ logsumexp(loglik + log_prior(*np.exp(params)), axis=1))

    best = minimize(nll, np.log([1.0, 5.0]), method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-3})
    a, b = np.exp(best.x)
    return float(a), float(b)


def log_prior(a: float, b: float) -> np.ndarray:
    """log of each grid bin's Beta(a, b) mass: exact (the CDF's increments), as a density at the
    midpoints misses most of the mass that a < 1 puts near 0."""
    return np.log(np.maximum(np.diff(betainc(a, b, EDGES)), 1e-300))


def posterior(loglik: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """The posterior mean and mode of γ on the grid under a Beta(a, b) prior, one per row."""
    log_post = loglik + log_prior(a, b)
    weights = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    return weights @ GRID / weights.sum(axis=1), GRID[log_post.argmax(axis=1)]


def check_fit(pairs: int = 20_000, seed: int = 0) -> None:
    """Does `fit_prior` recover a known prior? γ of `pairs` pairs drawn from two Beta priors, each
    pair shown Poisson(3) times at each rank 1-10 and clicked under a PBM with θ_k = 1/k."""
    rng = np.random.default_rng(seed)
    theta = 1.0 / np.arange(1, 11)
    for a, b in ((2.0, 8.0), (0.5, 3.0)):
        gamma = rng.beta(a, b, pairs)
        shown = rng.poisson(3, (pairs, len(theta)))
        clicks = rng.binomial(shown, theta[None, :] * gamma[:, None])
        fa, fb = fit_prior(clicks, shown - clicks, theta)
        print(f"true Beta({a:g}, {b:g}) -> fitted Beta({fa:.3f}, {fb:.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--lists", type=Path, help="a `dssm negatives --debias --list-targets map` output")
    p.add_argument("--check", action="store_true", help="fit two known priors from simulated clicks, and stop")
    args = p.parse_args()
    if args.check:
        check_fit()
        return
    if args.lists is None:
        p.error("--lists is required (or --check)")
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")
    manifest = require_manifest(args.lists, "negatives")
    params = manifest["params"]
    if not (params.get("debias") and params.get("list_size") and params.get("list_targets") == "map"):
        sys.exit(f"{args.lists}: build it with `dssm negatives --debias --list-size K --list-targets map`")
    curve = examination_curve(Path(manifest["inputs"]["propensity"]["path"]), params["min_propensity"])
    pairs, clicks, skips = rank_counts(Path(manifest["inputs"]["clean"]["path"]))
    # ranks past the curve's end take its last value, as `dssm negatives` does
    theta = np.array(curve + [curve[-1]] * (clicks.shape[1] - len(curve)))[: clicks.shape[1]]
    a, b = fit_prior(clicks, skips, theta)
    fixed_a, fixed_b = params["prior_clicks"] + 1, params["prior_skips"] + 1  # map's Beta(a + 1, b + 1)
    print(
        f"{len(pairs):,} pairs; curve clipped at "
        f"{params['min_propensity']}\nfitted prior Beta({a:.3f}, {b:.3f}): mean {a / (a + b):.4f}, "
        f"worth {a + b:.2f} examinations; map's fixed Beta({fixed_a:g}, {fixed_b:g}): mean "
        f"{fixed_a / (fixed_a + fixed_b):.4f}, mode {(fixed_a - 1) / (fixed_a + fixed_b - 2):.4f}\n"
    )

    listed = dict(sorted(lists(args.lists).items()))
    index = {(q, t): i for i, (q, t) in enumerate(zip(pairs["query"], pairs["title"], strict=True))}
    rows = np.array([index[q, t] for q, (titles, _) in listed.items() for t in titles])
    mean, mode = posterior(log_likelihoods(clicks[rows], skips[rows], theta), a, b)
    ratio = clicks[rows].sum(axis=1) / ((clicks[rows] + skips[rows]) @ theta)
    grades = mean_labels(read_judgments(args.judgments))
    min_label = min(grades.values())
    orders, at = [], 0
    for query, (titles, targets) in listed.items():
        span = slice(at, at + len(titles))
        at += len(titles)
        labels = np.array([grades.get((query, t), min_label) for t in titles])
        orders.append((labels, {"map": targets, "eb-mean": mean[span], "eb-mode": mode[span], "ratio": ratio[span]}))
    print_scores(score_orders(orders, min_label), [("eb-mean", "map"), ("eb-mode", "map"), ("map", "ratio")])


if __name__ == "__main__":
    main()
