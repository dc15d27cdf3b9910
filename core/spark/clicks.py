"""The click model over `clean/impressions` rows, shared by the stages that read clicks: how often each
title was shown and clicked at each rank (propensity's EM reads it), and each shown pair's examinations and
debiased clicks under the propensity stage's curve θ(rank) (negatives' list targets, judge's grades)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def shown_cells(impressions):  # DataFrame -> DataFrame (pyspark is imported lazily here)
    """(query, title, rank, shown, clicks) of `clean/impressions` rows: how often each title was
    shown at each rank for a query, and clicked there."""
    from pyspark.sql import functions as F

    shown = impressions.select("query", F.posexplode(F.arrays_zip("titles", "positions", "clicked")).alias("i", "r"))
    return shown.groupBy("query", F.col("r.titles").alias("title"), F.col("r.positions").alias("rank")).agg(
        F.count("*").alias("shown"), F.sum(F.col("r.clicked").cast("long")).alias("clicks")
    )


BISECTIONS = 50  # halvings of γ's interval (0, 1) in `map_attractiveness`: to 1e-15


def examination_curve(propensity_dir: Path | None, min_propensity: float) -> list[float]:
    """θ(1), θ(2), … from `dssm propensity`'s curve, each at least `min_propensity`; ranks the
    estimate skipped take the rank above's θ, ranks past the end the last one's. [1.0] without a curve."""
    if propensity_dir is None:
        return [1.0]
    curve = json.loads((Path(propensity_dir) / "propensity.json").read_text())
    known = dict(zip(curve["ranks"], curve["examination"], strict=True))
    theta = []
    for rank in range(1, max(known) + 1):
        theta.append(known.get(rank, theta[-1] if theta else 1.0))
    return [max(float(t), min_propensity) for t in theta]


def examined_pairs(impressions: DataFrame, theta: list[float], prior: tuple[float, float] | None = None) -> DataFrame:
    """(query, title, shown, clicks, examinations, debiased_clicks, relevance) per title shown for a
    query: its showings, its clicks, Σ θ(rank) over its showings, Σ 1/θ(rank) over its clicks and its list target:
    clicks / examinations, or with `prior` = (prior_clicks, prior_skips) `map_attractiveness`.
    Integer counts per rank first, then one sum per pair in rank order, so the floating-point sums
    are the same on every rerun."""
    per_pair = (
        shown_cells(impressions)
        .groupBy("query", "title")
        .agg(
            F.sort_array(F.collect_list(F.struct("rank", "shown", "clicks"))).alias("cells"),
            F.sum("clicks").alias("clicks"),
        )
    )
    theta_at = curve_at_rank(theta)
    zero = F.lit(0.0).cast("double")
    examined = per_pair.select(
        "query",
        "title",
        "clicks",
        "cells",
        F.aggregate("cells", F.lit(0).cast("long"), lambda acc, c: acc + c["shown"]).alias("shown"),
        F.aggregate("cells", zero, lambda acc, c: acc + c["shown"] * theta_at(c)).alias("examinations"),
        F.aggregate("cells", zero, lambda acc, c: acc + c["clicks"] / theta_at(c)).alias("debiased_clicks"),
    )
    if prior is None:
        relevance = F.col("clicks") / F.col("examinations")
    else:
        relevance = map_attractiveness(F.col("cells"), F.col("clicks"), theta_at, *prior)
    columns = ["query", "title", "shown", "clicks", "examinations", "debiased_clicks"]
    return examined.select(*columns, relevance.alias("relevance"))


def curve_at_rank(theta: list[float]) -> Callable[[Column], Column]:
    """θ(rank) of a cell (a struct with a `rank` field), the curve's last value beyond its end."""
    curve = F.array(*[F.lit(t) for t in theta])
    return lambda cell: F.element_at(curve, F.least(cell["rank"], F.lit(len(theta))))


def map_attractiveness(
    cells: Column, clicks: Column, theta_at: Callable[[Column], Column], prior_clicks: float, prior_skips: float
) -> Column:
    """The γ in (0, 1) that maximises (clicks + a)·log γ + b·log(1 − γ) + Σ skipped·log(1 − θ·γ)
    over a pair's (rank, shown, clicks) cells, a = prior_clicks and b = prior_skips: the posterior
    mode of the PBM's attractiveness with a Beta(a + 1, b + 1) prior, the fixed point of Wang et al.'s
    EM for γ with θ held at the curve. The objective is concave, so the root of its slope is found by
    bisection: a fixed number of steps, the same on every rerun. With θ = 1 it is
    (clicks + a) / (shown + a + b)."""
    zero = F.lit(0.0).cast("double")

    def slope(g: Column) -> Column:
        skipped = F.aggregate(
            cells, zero, lambda acc, c: acc + (c["shown"] - c["clicks"]) * theta_at(c) / (1 - theta_at(c) * g)
        )
        return (clicks + prior_clicks) / g - prior_skips / (1 - g) - skipped

    def halve(bounds: Column, _: Column) -> Column:
        lo, mid, hi = bounds["lo"], (bounds["lo"] + bounds["hi"]) / 2, bounds["hi"]
        return F.when(slope(mid) > 0, F.struct(mid.alias("lo"), hi.alias("hi"))).otherwise(
            F.struct(lo.alias("lo"), mid.alias("hi"))
        )

    start = F.struct(zero.alias("lo"), F.lit(1.0).cast("double").alias("hi"))
    bounds = F.aggregate(F.sequence(F.lit(1), F.lit(BISECTIONS)), start, halve)
    return (bounds["lo"] + bounds["hi"]) / 2
