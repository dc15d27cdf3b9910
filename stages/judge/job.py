"""`dssm judge`: a judged set graded from the logs' own clicks, for teams with logs and no human grades.

Each query's shown titles are graded by their attractiveness under the position-based model: clicks
over expected examinations Σ θ(rank) (θ: the propensity stage's curve), or with `debias=false` clicks
over impressions (raw CTR). The grade is on Home Depot's scale, `1 + 2·min(1, rate)` (1: never
clicked, 3: clicked whenever examined), so PROTOCOL.md's NDCG, relevance threshold (2.5) and reports
apply unchanged. A title shown fewer than `min_shown` times for a query is left out; so is a query
with fewer than `min_impressions` impressions, no title shown `min_shown` times, no click, or fewer
than two graded titles (each counted in the manifest).

Every query of the log is graded. Its test queries (PROTOCOL.md §3) are the held-out evaluation
queries: the data stages that training reads leave them out (core/spark/heldout.py). The train
queries' grades are what `evaluate` tunes its fusions on, for the validation queries only (no
trained-on query). Output: `judged.csv` (search_term, product_title, relevance; UTF-8) and the manifest
with the counts. docs/evaluation.md#judged-sets-from-clicks says when this set decides.
"""

from __future__ import annotations

import argparse
import csv
import logging
from pathlib import Path
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from core.artifacts import code_fingerprint, publish, require_manifest
from core.errors import DssmError
from core.judgments import CLICK_SCALE, CLICK_SPEC, JUDGED_FILE
from core.spark import cluster_errors
from core.spark.clicks import examination_curve, examined_pairs
from core.text import is_test_query
from stages.judge.config import NIGHTLY, JudgeConfig, check_config, grading

log = logging.getLogger(__name__)


def judge(
    spark,
    clean_dir: Path,
    out: Path,
    cfg: JudgeConfig = JudgeConfig(),
    force: bool = False,
    propensity_dir: Path | None = None,
) -> dict[str, Any]:
    """Grade `clean_dir/impressions/` into `out/judged.csv`; `propensity_dir` (a `dssm propensity`
    output) is read with `cfg.debias` only."""
    check_config(cfg)
    clean = require_manifest(clean_dir, "clean")
    if "impressions" not in clean.get("outputs", {}):
        raise DssmError(f"judge grades the shown titles of a `dssm clean` output's impressions/; {clean_dir} has none")
    inputs = {"clean": {"path": str(clean_dir), "sha256": clean["content_sha256"]}}
    upstreams = [clean]
    if cfg.debias:
        if propensity_dir is None:
            raise DssmError("judge.debias needs the examination curve (--propensity); or set debias=false (raw CTR)")
        curve = require_manifest(Path(propensity_dir), "propensity")
        inputs["propensity"] = {"path": str(propensity_dir), "sha256": curve["content_sha256"]}
        upstreams.append(curve)
    theta = examination_curve(Path(propensity_dir) if cfg.debias else None, cfg.min_propensity)

    def build(tmp: Path) -> dict[str, Any]:
        impressions = spark.read.parquet(str(clean_dir / "impressions"))
        low, high = CLICK_SCALE
        grade = F.round(low + (high - low) * F.least(F.col("relevance"), F.lit(1.0)), 6).alias("grade")
        graded = examined_pairs(impressions, theta).where(F.col("shown") >= cfg.min_shown)
        graded = graded.select("query", "title", "clicks", grade)
        queries = impressions.groupBy("query").agg(F.count("*").alias("impressions"))
        per_query = graded.groupBy("query").agg(F.count("*").alias("titles"), F.sum("clicks").alias("clicks"))
        queries = queries.join(per_query, "query", "left").select("query", _reason(cfg).alias("reason")).persist()
        found = {r["reason"]: r["count"] for r in queries.groupBy("reason").count().collect()}
        counts = {reason: found.get(reason, 0) for reason in REASONS}
        kept = queries.where(F.col("reason") == "graded").select("query")
        rows = graded.join(kept, "query").orderBy("query", "title").select("query", "title", "grade")
        pairs = test_pairs = 0
        test_queries: set[str] = set()
        with open(tmp / JUDGED_FILE, "w", encoding=CLICK_SPEC.encoding, newline="") as f:
            writer = csv.writer(f)
            writer.writerow([CLICK_SPEC.query_col, CLICK_SPEC.title_col, CLICK_SPEC.label_col])
            for row in rows.toLocalIterator():  # streamed: a big log's judged set never sits in the driver at once
                writer.writerow(row)
                pairs += 1
                if is_test_query(row["query"]):
                    test_pairs += 1
                    test_queries.add(row["query"])
        queries.unpersist()
        counts = {"queries_seen": sum(counts.values()), "queries": counts.pop("graded"), **counts}
        counts |= {"pairs": pairs, "test_pairs": test_pairs, "test_queries": len(test_queries)}
        if not test_queries:  # said here, before training, rather than by evaluate after it
            raise DssmError(
                f"judge: no held-out test query (PROTOCOL.md §3) among the {counts['queries']:,} graded of "
                f"{counts['queries_seen']:,} queries: nothing to evaluate on (left out: {counts['few_impressions']:,} "
                f"with fewer than {cfg.min_impressions} impressions, {counts['few_shown']:,} with no title shown "
                f"{cfg.min_shown} times, {counts['no_click']:,} without a click, {counts['one_title']:,} with one "
                "title)"
            )
        log.info(
            "judge: %(queries)d queries graded (%(test_queries)d held-out test queries), %(pairs)d pairs; left out: "
            "%(few_impressions)d with few impressions, %(few_shown)d with no title shown %(min_shown)d times, "
            "%(no_click)d without a click, %(one_title)d with one title",
            counts | {"min_shown": cfg.min_shown},
        )
        return {"counts": counts, "outputs": {"judged": JUDGED_FILE}, "scale": _scale(cfg)}

    params = grading(cfg)
    with cluster_errors(out):
        # every file hashed before it counts as up to date: a hand edit of judged.csv that keeps its size is caught
        return publish(out, "judge", code_fingerprint(__name__), inputs, params, build, force, upstreams, True)


REASONS = ("graded", "few_impressions", "few_shown", "no_click", "one_title")  # why a query is in or out


def _reason(cfg: JudgeConfig) -> Column:
    """Why a query keeps its grades ("graded") or is left out: the first of REASONS' checks it fails."""
    return (
        F.when(F.col("impressions") < cfg.min_impressions, "few_impressions")
        .when(F.col("titles").isNull(), "few_shown")
        .when(F.col("clicks") == 0, "no_click")
        .when(F.col("titles") < 2, "one_title")
        .otherwise("graded")
    )


def _scale(cfg: JudgeConfig) -> str:
    rate = "clicks / Σ θ(rank) over its showings" if cfg.debias else "clicks / impressions"
    return f"1 + 2·min(1, rate), rate = {rate}; 1: never clicked, 3: clicked whenever examined"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm judge`'s options: the inputs and output, JudgeConfig's fields, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output (its impressions/)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--propensity", type=Path, help="a `dssm propensity` output: the examination curve (debias)")
    add_config_options(p, JudgeConfig, skip=NIGHTLY)  # a windowed `dssm run`'s keys
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm judge`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(JudgeConfig, args)
    m = judge(LazySpark(args.master, "dssm-judge"), args.clean, args.out, cfg, args.force, args.propensity)
    c = m["counts"]
    print(
        f"{c['queries']:,} queries graded from clicks ({c['test_queries']:,} held-out test queries), "
        f"{c['pairs']:,} pairs -> {args.out / JUDGED_FILE}"
    )
