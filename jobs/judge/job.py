"""`dssm judge`: a judged set graded from the logs' own clicks, for teams with logs and no human grades.

Each query's shown titles are graded by their attractiveness under the position-based model: clicks
over expected examinations Σ θ(rank) (θ: the propensity stage's curve), or with `debias=false` clicks
over impressions (raw CTR). The grade is on Home Depot's scale, `1 + 2·min(1, rate)` (1: never
clicked, 3: clicked whenever examined), so PROTOCOL.md's NDCG, relevance threshold (2.5) and reports
apply unchanged. A title shown fewer than `min_shown` times for a query is left out; so is a query
with fewer than `min_impressions` impressions, no click, or fewer than two graded titles.

Every query of the log is graded. Its test queries (PROTOCOL.md §3) are the held-out evaluation
queries: the data stages that training reads leave them out (jobs/spark/heldout.py). The train
queries' grades are what `evaluate` tunes its fusions on, for the validation queries only (no
trained-on query). Output: `judged.csv` (search_term, product_title, relevance; UTF-8) and the manifest
with the counts. docs/evaluation.md#judged-sets-from-clicks says when this set decides.
"""

from __future__ import annotations

import argparse
import csv
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from core.artifacts import code_fingerprint, publish, require_manifest
from core.errors import DssmError
from core.text import is_test_query
from jobs.judge.config import CLICK_SCALE, JUDGED_FILE, JudgeConfig, check_config, click_judged_set
from jobs.negatives.job import examination_curve, examined_pairs
from jobs.spark import cluster_errors

log = logging.getLogger(__name__)
SPEC = click_judged_set(".", "", "").spec  # how judged.csv is read back: Home Depot's column names, UTF-8


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
        per_query = impressions.groupBy("query").agg(F.count("*").alias("impressions"))
        shown = examined_pairs(impressions, theta).where(F.col("shown") >= cfg.min_shown)
        low, high = CLICK_SCALE
        grade = low + (high - low) * F.least(F.col("relevance"), F.lit(1.0))
        graded = shown.select("query", "title", "clicks", F.round(grade, 6).alias("grade"))
        queries = per_query.join(
            graded.groupBy("query").agg(F.count("*").alias("titles"), F.sum("clicks").alias("clicks")), "query", "left"
        ).toArrow()
        kept, counts = _kept_queries(queries.to_pylist(), cfg.min_impressions)
        rows = graded.orderBy("query", "title").select("query", "title", "grade").toArrow().to_pylist()
        rows = [r for r in rows if r["query"] in kept]
        with open(tmp / JUDGED_FILE, "w", encoding=SPEC.encoding, newline="") as f:
            writer = csv.writer(f)
            writer.writerow([SPEC.query_col, SPEC.title_col, SPEC.label_col])
            writer.writerows([r["query"], r["title"], r["grade"]] for r in rows)
        test = [r for r in rows if r["query"] in kept and is_test_query(r["query"])]
        counts |= {"pairs": len(rows), "test_pairs": len(test), "test_queries": len({r["query"] for r in test})}
        log.info(
            "judge: %(queries)d queries graded (%(test_queries)d held-out test queries), %(pairs)d pairs; left out: "
            "%(few_impressions)d with few impressions, %(no_click)d without a click, %(one_title)d with one title",
            counts,
        )
        return {"counts": counts, "outputs": {"judged": JUDGED_FILE}, "scale": _scale(cfg)}

    with cluster_errors(out):
        return publish(out, "judge", code_fingerprint(__name__), inputs, asdict(cfg), build, force, upstream=upstreams)


def _kept_queries(queries: list[dict[str, Any]], min_impressions: int) -> tuple[set[str], dict[str, int]]:
    """The queries that keep their grades, and why the others were left out (each counted once)."""
    kept: set[str] = set()
    counts = {"queries_seen": len(queries), "few_impressions": 0, "no_click": 0, "one_title": 0}
    for q in queries:
        if q["impressions"] < min_impressions:
            counts["few_impressions"] += 1
        elif not q["clicks"]:
            counts["no_click"] += 1
        elif (q["titles"] or 0) < 2:
            counts["one_title"] += 1
        else:
            kept.add(q["query"])
    counts["queries"] = len(kept)
    return kept, counts


def _scale(cfg: JudgeConfig) -> str:
    rate = "clicks / Σ θ(rank) over its showings" if cfg.debias else "clicks / impressions"
    return f"1 + 2·min(1, rate), rate = {rate}; 1: never clicked, 3: clicked whenever examined"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm judge`'s options: the inputs and output, JudgeConfig's fields, Spark's."""
    from core.options import add_config_options
    from jobs.spark import add_spark_options

    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output (its impressions/)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--propensity", type=Path, help="a `dssm propensity` output: the examination curve (debias)")
    add_config_options(p, JudgeConfig)
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm judge`."""
    from core.options import config_from_options
    from jobs.spark import LazySpark

    cfg = config_from_options(JudgeConfig, args)
    m = judge(LazySpark(args.master, "dssm-judge"), args.clean, args.out, cfg, args.force, args.propensity)
    c = m["counts"]
    print(
        f"{c['queries']:,} queries graded from clicks ({c['test_queries']:,} held-out test queries), "
        f"{c['pairs']:,} pairs -> {args.out / JUDGED_FILE}"
    )
