"""`dssm negatives`: (query, clicked title, n negative titles) rows for training, as Parquet shards.

Negatives are drawn uniformly from the title pool by hashing (seed, query, positive, k) to a pool
index for k = 0, 1, 2, …; candidates that were clicked for the same query (the positive included)
or repeat an earlier candidate are skipped, and the first `n` survivors are kept. Being a pure
function of the data and the seed, the result does not depend on Spark's partitioning or on the
number of workers. Queries are split into train and validation by a seeded hash.

With `skip_above` > 0, a share of each row's negatives are skip-above titles instead (Joachims
et al., SIGIR 2005): titles shown above the clicked title in one of its impressions and not clicked
there, nor ever clicked for the query. They are the user's own judgement that those titles looked
worse, harder than random pool titles. Up to round(skip_above * n) of them per row, chosen by a
hash of (seed, query, positive, title); the random draws fill the rest, in their order.

Position-debiased signals (`debias`, `list_size`; docs/training.md) come from the impressions and
the examination curve θ(rank) of `dssm propensity`:
- `debiased_clicks`, Σ 1/θ(rank) over a pair's clicks: the inverse-propensity-weighted click count
  (Joachims et al., WSDM 2017) behind `loss.pair_weight=ipw|log_ipw`;
- with `list_size` > 0, one row per query carries the titles shown for it (the `list_size` most
  examined) and a relevance target for each, for `loss.listwise`. `list_targets="ratio"`: clicks
  over expected examinations, clicks / Σ θ(rank) over its showings. `list_targets="map"`: the
  title's attractiveness γ under the position-based model (a click at rank k has probability
  θ(k)·γ), its maximum a posteriori estimate from the title's clicks and skips given θ, with a
  Beta prior worth `prior_clicks` clicks in `prior_clicks + prior_skips` examinations. The prior
  keeps a title shown a few times at low ranks near the prior mean where the ratio makes one
  click worth up to 1/min_propensity.
θ is raised to `min_propensity` at least, which caps a click's weight at 1/min_propensity. Without
`debias`, θ = 1: `debiased_clicks` is the click count and the list targets are click-through rates
(`map`: smoothed towards the prior mean, (clicks + prior_clicks) / (shown + prior_clicks + prior_skips)).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from core.artifacts import code_fingerprint, publish, require_manifest
from core.config import check_choices
from core.errors import DssmError
from core.schemas import NEGATIVES
from core.spark import cluster_errors, distinct_count, write_parquet
from core.spark.clicks import examination_curve, examined_pairs
from core.spark.heldout import test_query_column, train_queries
from stages.negatives.config import NegativesConfig

log = logging.getLogger(__name__)
MAX_ROUNDS = 6


def validation_queries(pairs: DataFrame, cfg: NegativesConfig) -> DataFrame:
    """`pairs` with a boolean `valid`: a seeded hash of the query, so a query is on one side only."""
    bucket = F.pmod(F.xxhash64(F.lit(cfg.seed), F.lit("valid"), F.col("query")), F.lit(10_000))
    return pairs.withColumn("valid", bucket < F.lit(int(round(cfg.valid_fraction * 10_000))))


def sample_negatives(pairs: DataFrame, titles: DataFrame, cfg: NegativesConfig) -> DataFrame:
    """(query, positive, negatives[n], clicks, impressions) for every clicked pair."""
    if cfg.n == 0:  # the paraphrase objective draws its negatives from the mini-batch instead
        return pairs.select(
            "query",
            F.col("title").alias("positive"),
            F.array().cast("array<string>").alias("negatives"),
            "clicks",
            "impressions",
        )
    pool = titles.select("title").distinct()
    pool = pool.select("title", (F.row_number().over(Window.orderBy("title")) - 1).alias("idx"))
    pool_size = pool.count()
    widest = pairs.groupBy("query").count().agg(F.max("count")).first()[0] or 0
    if pool_size - widest < cfg.n:
        raise DssmError(
            f"title pool too small: {pool_size} titles, a query with {widest} clicked titles, {cfg.n} negatives wanted"
        )
    clicked = pairs.select("query", F.col("title").alias("negative"))
    todo = pairs.select("query", F.col("title").alias("positive"), "clicks", "impressions")
    done: DataFrame | None = None
    draws = 2 * cfg.n + 8
    for _ in range(MAX_ROUNDS):
        # Each round redraws the same k from 0 (hashes are pure), just more of them, so the
        # result is the first n survivors in k order however many rounds it took.
        k = F.explode(F.sequence(F.lit(0), F.lit(draws - 1))).alias("k")
        candidates = todo.select("query", "positive", k).withColumn(
            "idx", F.pmod(F.xxhash64(F.lit(cfg.seed), "query", "positive", "k"), F.lit(pool_size))
        )
        named = candidates.join(pool, "idx").select("query", "positive", "k", F.col("title").alias("negative"))
        allowed = named.join(clicked, ["query", "negative"], "left_anti")
        first_k = allowed.groupBy("query", "positive", "negative").agg(F.min("k").alias("k"))
        picked = first_k.groupBy("query", "positive").agg(
            F.slice(F.sort_array(F.collect_list(F.struct("k", "negative"))), 1, cfg.n)["negative"].alias("negatives")
        )
        rows = (
            todo.join(picked, ["query", "positive"], "left")
            .withColumn("negatives", F.coalesce("negatives", F.array().cast("array<string>")))
            .persist()
        )
        full = rows.where(F.size("negatives") == cfg.n)
        done = full if done is None else done.unionByName(full)
        todo = rows.where(F.size("negatives") < cfg.n).drop("negatives")
        if todo.count() == 0:
            return done
        draws *= 4
    raise DssmError(f"could not draw {cfg.n} negatives for {todo.count()} pairs in {MAX_ROUNDS} rounds")


def skipped_above(impressions: DataFrame, pairs: DataFrame) -> DataFrame:
    """(query, positive, negative): `negative` was shown above `positive` in an impression where
    `positive` was clicked and it was not, and it was never clicked for the query."""
    shown = impressions.select(
        "impression_id", "query", F.posexplode(F.arrays_zip("titles", "clicked")).alias("rank", "r")
    ).select("impression_id", "query", "rank", F.col("r.titles").alias("title"), F.col("r.clicked").alias("clicked"))
    clicks = shown.where("clicked").select("impression_id", F.col("rank").alias("clicked_rank"), "title")
    skips = shown.where(~F.col("clicked")).select("impression_id", "query", "rank", F.col("title").alias("negative"))
    above = skips.join(clicks, "impression_id").where(F.col("rank") < F.col("clicked_rank"))
    found = above.select("query", F.col("title").alias("positive"), "negative").distinct()
    return found.join(pairs.select("query", F.col("title").alias("negative")), ["query", "negative"], "left_anti")


def mix_skipped(rows: DataFrame, skipped: DataFrame, cfg: NegativesConfig) -> DataFrame:
    """`rows` with up to round(skip_above * n) of their negatives replaced by skip-above titles."""
    hard = max(0, min(cfg.n, round(cfg.skip_above * cfg.n)))
    ranked = skipped.withColumn("h", F.xxhash64(F.lit(cfg.seed), F.lit("skip"), "query", "positive", "negative"))
    chosen = ranked.groupBy("query", "positive").agg(
        F.slice(F.sort_array(F.collect_list(F.struct("h", "negative"))), 1, hard)["negative"].alias("hard")
    )
    hard_col = F.coalesce("hard", F.array().cast("array<string>"))
    mixed = F.concat(
        hard_col,
        F.slice(F.filter("negatives", lambda x: ~F.array_contains(hard_col, x)), 1, F.lit(cfg.n) - F.size(hard_col)),
    )
    return (
        rows.join(chosen, ["query", "positive"], "left")
        .withColumn("negatives", mixed)
        .withColumn("skip_above", F.size(hard_col))
        .drop("hard")
    )


def listwise_targets(examined: DataFrame, rows: DataFrame, list_size: int) -> DataFrame:
    """(query, positive, shown, relevance): each query's `list_size` most examined shown titles (ties
    by title) and their relevance (`examined_pairs`), on the query's first positive; queries whose
    list has fewer than 2 titles or no positive target get none."""
    entry = F.struct((-F.col("examinations")).alias("order"), "title", F.col("relevance").alias("r"))
    lists = examined.groupBy("query").agg(F.slice(F.sort_array(F.collect_list(entry)), 1, list_size).alias("l"))
    lists = lists.select("query", F.col("l.title").alias("shown"), F.col("l.r").alias("relevance")).where(
        (F.size("shown") >= 2) & (F.aggregate("relevance", F.lit(0.0).cast("double"), lambda a, x: a + x) > 0)
    )
    first = rows.groupBy("query").agg(F.min("positive").alias("positive"))
    return first.join(lists, "query")


def add_debiased(rows: DataFrame, impressions: DataFrame | None, cfg: NegativesConfig, theta: list[float]) -> DataFrame:
    """`rows` with `debiased_clicks`, `shown` and `relevance` (NEGATIVES); without impressions to
    read (neither `debias` nor lists asked for) the click count and empty lists."""
    if impressions is not None:
        prior = (cfg.prior_clicks, cfg.prior_skips) if cfg.list_targets == "map" and cfg.list_size else None
        examined = examined_pairs(impressions, theta, prior).persist()
        weighted = examined.select("query", F.col("title").alias("positive"), "debiased_clicks")
        rows = rows.join(weighted, ["query", "positive"], "left")
        if cfg.list_size:
            rows = rows.join(listwise_targets(examined, rows, cfg.list_size), ["query", "positive"], "left")
    defaults = {
        "debiased_clicks": F.col("clicks").cast("double"),
        "shown": F.array().cast("array<string>"),
        "relevance": F.array().cast("array<double>"),
    }
    return rows.select(
        *[c for c in rows.columns if c not in defaults],
        *[(F.coalesce(c, d) if c in rows.columns else d).alias(c) for c, d in defaults.items()],
    )


def negatives(
    spark: SparkSession,
    clean_dir: Path,
    out: Path,
    cfg: NegativesConfig = NegativesConfig(),
    force: bool = False,
    propensity_dir: Path | None = None,
) -> dict[str, Any]:
    """Write the training rows of `clean_dir` into `out`; `propensity_dir` (a `dssm propensity`
    output) is read with `cfg.debias` only."""
    upstream = require_manifest(clean_dir, "clean")
    if cfg.n < 0 or cfg.shards < 1 or not 0 <= cfg.valid_fraction < 1 or not 0 <= cfg.skip_above <= 1:
        raise DssmError("need n >= 0, shards >= 1, 0 <= valid_fraction < 1 and 0 <= skip_above <= 1")
    if cfg.list_size < 0 or not 0 < cfg.min_propensity <= 1 or min(cfg.prior_clicks, cfg.prior_skips) < 0:
        raise DssmError("need list_size >= 0, 0 < min_propensity <= 1, prior_clicks >= 0 and prior_skips >= 0")
    check_choices(cfg)
    reads_impressions = bool(cfg.skip_above or cfg.debias or cfg.list_size)
    if reads_impressions and "impressions" not in upstream.get("outputs", {}):
        raise DssmError(
            f"skip_above, debias and list_size need the impressions of a `dssm clean` output; {clean_dir} has none"
        )
    inputs = {"clean": {"path": str(clean_dir), "sha256": upstream["content_sha256"]}}
    upstreams = [upstream]
    if cfg.debias:
        if propensity_dir is None:
            raise DssmError("debias needs the examination curve: pass a `dssm propensity` output (--propensity)")
        curve = require_manifest(Path(propensity_dir), "propensity")
        inputs["propensity"] = {"path": str(propensity_dir), "sha256": curve["content_sha256"]}
        upstreams.append(curve)
    theta = examination_curve(Path(propensity_dir) if cfg.debias else None, cfg.min_propensity)

    def build(tmp: Path) -> dict[str, Any]:
        # a log's test queries are held out (PROTOCOL.md §3): the judge stage grades them
        clicked = spark.read.parquet(str(clean_dir / "pairs"))
        pairs = train_queries(clicked, upstream)
        titles = spark.read.parquet(str(clean_dir / "titles"))
        rows = sample_negatives(pairs, titles, cfg)
        counts: dict[str, Any] = {}
        impressions = spark.read.parquet(str(clean_dir / "impressions")) if reads_impressions else None
        impressions = train_queries(impressions, upstream) if impressions is not None else None
        if cfg.skip_above and cfg.n:
            rows = mix_skipped(rows, skipped_above(impressions, pairs), cfg).persist()
            counts["skip_above_negatives"] = rows.agg(F.sum("skip_above")).first()[0] or 0
            rows = rows.drop("skip_above")
        rows = add_debiased(rows, None if not (cfg.debias or cfg.list_size) else impressions, cfg, theta).persist()
        if cfg.list_size:
            counts["listwise_queries"] = rows.where(F.size("shown") > 0).count()
        rows = validation_queries(rows, cfg)
        for split, files in (("train", cfg.shards), ("valid", max(1, cfg.shards // 4))):
            part = rows.where(F.col("valid") == (split == "valid"))
            ordered = part.repartition(files, "query").sortWithinPartitions("query", "positive")
            counts[f"{split}_rows"] = write_parquet(ordered, tmp / split, NEGATIVES)
            counts[f"{split}_queries"] = distinct_count(tmp / split, "query")
        counts["pool_titles"] = upstream["counts"]["titles"]
        if upstream.get("kind") != "paraphrase":
            held_out = clicked.where(test_query_column(F.col("query")))
            counts["held_out_queries"] = held_out.select("query").distinct().count()
        # Drop the sampling rounds' persisted rows: a later job in this session that reads the same
        # paths after they were rewritten (the next night's window) would otherwise get them back.
        spark.catalog.clearCache()
        log.info(
            "negatives: %(train_rows)d train rows (%(train_queries)d queries), "
            "%(valid_rows)d valid rows (%(valid_queries)d queries)",
            counts,
        )
        return {"counts": counts, "outputs": {"train": "train/", "valid": "valid/"}}

    code = code_fingerprint(__name__)
    with cluster_errors(out):
        return publish(out, "negatives", code, inputs, asdict(cfg), build, force, upstream=upstreams)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm negatives`'s options: the inputs and output, NegativesConfig's fields, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output directory")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--propensity", type=Path, help="a `dssm propensity` output: the examination curve (--debias)")
    add_config_options(p, NegativesConfig)
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm negatives`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(NegativesConfig, args)
    if args.propensity and not cfg.debias:
        raise DssmError("--propensity is read with --debias only: add --debias, or leave --propensity out")
    spark = LazySpark(args.master, "dssm-negatives")
    m = negatives(spark, args.clean, args.out, cfg, force=args.force, propensity_dir=args.propensity)
    c = m["counts"]
    print(f"{c['train_rows']:,} train rows, {c['valid_rows']:,} validation rows -> {args.out}")
