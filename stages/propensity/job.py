"""`dssm propensity`: the examination probability of each rank, estimated from the impressions alone.

The position-based model (PBM; Richardson et al. 2007, Chuklin et al. 2015 §3.3) says a title
shown at rank k for query q is clicked with probability θ_k · γ_qt: it is examined with a
probability that depends on the rank only, and clicked when examined with a probability that
depends on the (query, title) only. Both are estimated by expectation-maximisation over the
(query, title, rank) counts of shown results and clicks (Wang et al., WSDM 2018, "Position Bias
Estimation for Unbiased Learning to Rank in Personal Search", §4.1, with one γ per pair instead
of their regression). The model is identified because the production ranker is noisy: one title
is shown at several ranks for one query. θ is identified up to a factor only, so the curve is
reported relative to rank 1 (θ_1 = 1).

Spark counts the (query, title, rank) cells of `clean/impressions/`; the EM runs on those in
numpy (509k cells for 200k Home Depot impressions, estimated in 5-6 s).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.artifacts import code_fingerprint, publish, read_manifest, require_manifest
from core.errors import DssmError
from stages.propensity.config import PropensityConfig

log = logging.getLogger(__name__)
CURVE_FILE = "propensity.json"
PLOT_FILE = "propensity.png"


@dataclass(frozen=True)
class Cells:
    """Shown/clicked counts per (pair, rank) cell; `pair` indexes distinct (query, title)."""

    pair: np.ndarray
    rank: np.ndarray  # 1-based
    shown: np.ndarray
    clicks: np.ndarray


def estimate(
    cells: Cells, max_rank: int, iterations: int = 2_000, tolerance: float = 1e-7, min_shown: int = 1
) -> dict[str, Any]:
    """θ_1..θ_max_rank (θ_1 = 1) by EM under the PBM; also the iterations run and the final
    log-likelihood of the cells.

    Pairs shown fewer than `min_shown` times are left out: a pair seen once or twice gets a γ of
    0 or 1 from its own clicks, which pushes its ranks' θ up (measured on a simulated Home Depot
    log of 200k impressions, η = 1: +4.5% at rank 2 and +5.9% at rank 5 with every pair, within 1%
    at ranks 2-5 with pairs shown 10+ times; BENCHMARKS.md). Leaving pairs out by how often they were shown, never by
    their clicks, biases nothing."""
    total_shown = int(cells.shown.sum())
    if min_shown > 1:
        keep = np.bincount(cells.pair, cells.shown)[cells.pair] >= min_shown
        cells = Cells(cells.pair[keep], cells.rank[keep], cells.shown[keep], cells.clicks[keep])
    if len(cells.rank) == 0 or cells.shown.sum() == 0:
        raise DssmError(f"no pair shown at least {min_shown} times to estimate position bias from")
    k = cells.rank - 1
    n, c = cells.shown.astype(float), cells.clicks.astype(float)
    skipped = n - c
    pairs = int(cells.pair.max()) + 1
    shown_at = np.bincount(k, n, max_rank)
    shown_pair = np.bincount(cells.pair, n, pairs)
    theta = np.full(max_rank, 0.5)
    gamma = np.full(pairs, 0.5)
    eps = 1e-12
    step, moved = 0, np.inf
    while step < iterations and moved >= tolerance:
        step += 1
        t, g = theta[k], gamma[cells.pair]
        unclicked = np.maximum(1.0 - t * g, eps)
        examined_not_attractive = t * (1.0 - g) / unclicked  # P(E=1, R=0 | no click)
        attractive_not_examined = (1.0 - t) * g / unclicked  # P(E=0, R=1 | no click)
        new_theta = np.bincount(k, c + skipped * examined_not_attractive, max_rank) / np.maximum(shown_at, eps)
        gamma = np.bincount(cells.pair, c + skipped * attractive_not_examined, pairs) / np.maximum(shown_pair, eps)
        moved = np.abs(new_theta - theta).max()
        theta = np.clip(new_theta, eps, 1.0)
    p = np.clip(theta[k] * gamma[cells.pair], eps, 1 - eps)
    log_likelihood = float((c * np.log(p) + skipped * np.log(1 - p)).sum())
    # The curve is identified by pairs shown at more than one rank; with none (a deterministic
    # ranker) examination and relevance cannot be told apart, and the curve says nothing.
    ranks_per_pair = np.bincount(cells.pair, minlength=pairs)
    varied = float(n[ranks_per_pair[cells.pair] > 1].sum() / n.sum())
    relative = theta / theta[0]
    clicked_at = np.bincount(k, c, max_rank)
    seen = shown_at > 0
    return {
        "ranks": [int(r) + 1 for r in np.flatnonzero(seen)],
        "examination": [round(float(v), 6) for v in relative[seen]],
        "iterations": step,
        "converged": bool(moved < tolerance),
        "log_likelihood": log_likelihood,
        "shown_used": round(float(n.sum() / total_shown), 4),  # share of shown results in pairs kept
        "shown_at_varied_ranks": round(varied, 4),  # share of shown results whose pair appears at 2+ ranks
        "shown_per_rank": [int(v) for v in shown_at[seen]],
        "click_rate_per_rank": [round(float(v), 6) for v in (clicked_at / np.maximum(shown_at, 1))[seen]],
    }


def rank_cells(spark, impressions: Path, max_rank: int) -> tuple[Cells, int]:
    """The (query, title, rank) cells of `impressions/` and the number of impressions."""
    from core.spark.clicks import shown_cells
    from core.spark.heldout import train_queries

    rows = train_queries(spark.read.parquet(str(impressions)))  # test queries' clicks are held out (PROTOCOL.md §3)
    counted = shown_cells(rows).where(f"rank <= {int(max_rank)}")
    table = counted.orderBy("query", "title", "rank").toArrow()
    import pyarrow.compute as pc

    key = pc.binary_join_element_wise(table.column("query"), table.column("title"), "\x1f")
    pair = pc.dictionary_encode(key).combine_chunks().indices.to_numpy()
    cells = Cells(
        pair=pair.astype(np.int64),
        rank=table.column("rank").to_numpy().astype(np.int64),
        shown=table.column("shown").to_numpy(),
        clicks=table.column("clicks").to_numpy(),
    )
    return cells, rows.count()


def simulated_truth(clean_dir: Path) -> float | None:
    """The simulator's examination exponent η (θ_k = k^-η) when the clean input was a `dssm
    simulate` output, else None: the curve is then plotted against the truth."""
    clean = read_manifest(clean_dir) or {}
    raw = Path(str((clean.get("inputs") or {}).get("raw", {}).get("path", "")))
    for candidate in (raw, raw.parent):
        sim = read_manifest(candidate) if candidate.name else None
        if sim and sim.get("stage") == "simulate":
            return float(sim["params"]["click_model"]["eta"])
    return None


def plot(curve: dict[str, Any], path: Path, eta: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ranks = np.array(curve["ranks"])
    ax.plot(ranks, curve["examination"], "o-", label="estimated (EM under the PBM)")
    if eta is not None:
        ax.plot(ranks, ranks**-eta, "k--", label=f"simulator's truth: rank^-{eta:g}")
    ax.set(xlabel="rank", ylabel="examination, relative to rank 1", ylim=(0, 1.05), xticks=ranks)
    ax.set_title("Position bias estimated from the impressions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def propensity(spark, clean_dir: Path, out: Path, cfg: PropensityConfig = PropensityConfig(), force: bool = False):
    """Estimate the examination curve from `clean_dir/impressions/` into `out/` (propensity.json, a plot)."""
    clean = require_manifest(clean_dir, "clean")
    if "impressions" not in clean.get("outputs", {}):
        raise DssmError(f"{clean_dir} has no impressions/: rerun `dssm clean` (it writes them since issue 23)")

    def build(tmp: Path) -> dict[str, Any]:
        cells, impressions = rank_cells(spark, clean_dir / "impressions", cfg.max_rank)
        if not int(cells.clicks.sum()):  # EM would return its starting point, a flat curve, as if it were measured
            raise DssmError(
                f"propensity: the {impressions:,} impressions of {clean_dir / 'impressions'} (train queries) hold "
                "no click, so they say nothing about which ranks are examined; check that the logs' click field "
                "is read (docs/raw-log-format.md)"
            )
        curve = estimate(cells, cfg.max_rank, cfg.iterations, cfg.tolerance, cfg.min_shown)
        curve = {"method": "em-pbm", "impressions": impressions, "cells": len(cells.rank), **curve}
        eta = simulated_truth(clean_dir)
        if eta is not None:
            curve["simulated_eta"] = eta
        (tmp / CURVE_FILE).write_text(json.dumps(curve, indent=2) + "\n")
        plot(curve, tmp / PLOT_FILE, eta)
        log.info("propensity: %s", _curve_text(curve))
        if curve["shown_at_varied_ranks"] < 0.2:
            log.warning(
                "propensity: only %.0f%% of shown results belong to pairs seen at more than one rank; "
                "the curve is weakly identified",
                100 * curve["shown_at_varied_ranks"],
            )
        return {
            "counts": {"impressions": impressions, "cells": len(cells.rank), "iterations": curve["iterations"]},
            "outputs": {"curve": CURVE_FILE, "plot": PLOT_FILE},
        }

    inputs = {"clean": {"path": str(clean_dir), "sha256": clean["content_sha256"]}}
    return publish(out, "propensity", code_fingerprint(__name__), inputs, asdict(cfg), build, force=force)


def _curve_text(curve: dict[str, Any]) -> str:
    return ", ".join(f"{r}: {v:.3f}" for r, v in zip(curve["ranks"], curve["examination"], strict=True))


def read_curve(out: Path) -> dict[str, Any]:
    return json.loads((Path(out) / CURVE_FILE).read_text())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm propensity`'s options: the input and output, PropensityConfig's fields, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output (its impressions/)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    add_config_options(p, PropensityConfig)
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm propensity`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(PropensityConfig, args)
    propensity(LazySpark(args.master, "dssm-propensity"), args.clean, args.out, cfg, args.force)
    curve = read_curve(args.out)
    print(f"examination by rank (relative to rank 1): {_curve_text(curve)}")
    print(f"-> {args.out}")
