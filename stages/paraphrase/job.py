"""`dssm paraphrase`: sentence-pair files (Wiki-Auto, SICK/STS-B train, any TSV of paraphrases) into
the layout of a `dssm clean` output, so `dssm vocab` and `dssm negatives` prepare them exactly as
they prepare click pairs (Wieting & Gimpel 2017's training data, docs/paraphrase.md).

Each pair becomes a "clicked pair": query = sentence_norm(sentence1), title = sentence_norm(sentence2), clicks =
impressions = the times the pair occurs. Titles are the distinct second sentences. Unusable lines
are quarantined in rejects/ with a reason (malformed, empty_sentence, no_score, below_min_score,
header, blank), and read = kept + rejected.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from core.artifacts import code_fingerprint, content_sha256, publish
from core.config import check_choices
from core.errors import DssmError
from core.schemas import CLICK_PAIRS, REJECTS, TITLES
from core.sentence_pairs import SentencePair, is_header, parse_line, sentence_norm
from core.spark import cluster_errors, distinct_count, stable_layout, write_parquet
from stages.paraphrase.config import ParaphraseConfig

log = logging.getLogger(__name__)
ROWS_PER_FILE = 200_000
_PARSED = T.StructType(
    [T.StructField("s1", T.StringType()), T.StructField("s2", T.StringType()), T.StructField("reason", T.StringType())]
)


def _parser(cfg: ParaphraseConfig):
    def parse(line: str) -> tuple[str | None, str | None, str]:
        if not line.strip():
            return None, None, "blank"
        if is_header(line, cfg.format):
            return None, None, "header"
        pair = parse_line(line, cfg.format)
        if not isinstance(pair, SentencePair):
            return None, None, pair
        if cfg.min_score is not None and (pair.score is None or pair.score < cfg.min_score):
            return None, None, "below_min_score"
        s1, s2 = sentence_norm(pair.s1), sentence_norm(pair.s2)
        return s1, s2, "kept"

    return F.udf(parse, _PARSED)


def paraphrase(
    spark: SparkSession, input_path: str, out: Path, cfg: ParaphraseConfig = ParaphraseConfig(), force: bool = False
) -> dict[str, Any]:
    check_choices(cfg)
    source = Path(input_path)
    if not source.exists():
        raise DssmError(f"{source}: no such file or directory")
    source_hash = content_sha256(source)
    inputs = {"pairs": {"path": str(source), "sha256": source_hash}}

    def build(tmp: Path) -> dict[str, Any]:
        raw = spark.read.text(str(source)).select(F.col("_metadata.file_path").alias("source"), "value")
        parsed = raw.withColumn("p", _parser(cfg)("value")).select("source", "value", "p.*").persist()
        counts = {r["reason"]: r["count"] for r in parsed.groupBy("reason").count().collect()}
        lines_read = sum(counts.values())
        kept_n = counts.pop("kept", 0)
        if kept_n == 0:
            raise DssmError(
                f"no usable sentence pair in {source} as format {cfg.format!r}: {lines_read} lines ({counts})"
            )
        kept = parsed.where(F.col("reason") == "kept")
        pairs = kept.groupBy(F.col("s1").alias("query"), F.col("s2").alias("title")).agg(F.count("*").alias("clicks"))
        pairs = pairs.withColumn("impressions", F.col("clicks"))
        pairs = stable_layout(pairs, kept_n, ROWS_PER_FILE, "query", "title")
        n_pairs = write_parquet(pairs, tmp / "pairs", CLICK_PAIRS)
        titles = kept.groupBy(F.col("s2").alias("title")).agg(F.count("*").alias("clicks"))
        titles = titles.withColumn("impressions", F.col("clicks"))
        n_titles = write_parquet(stable_layout(titles, kept_n, ROWS_PER_FILE, "title"), tmp / "titles", TITLES)
        rejects = parsed.where(F.col("reason") != "kept").select(
            "source",
            "reason",
            F.lit(None).cast("string").alias("detail"),
            F.col("value").alias("raw"),
            F.lit(None).cast("string").alias("impression_id"),
            F.lit(None).cast("string").alias("user_id"),
        )
        rejects = stable_layout(rejects, lines_read - kept_n, ROWS_PER_FILE, "source", "raw")
        n_rejects = write_parquet(rejects, tmp / "rejects", REJECTS)
        parsed.unpersist()
        if lines_read != kept_n + n_rejects:
            raise DssmError(f"internal error: read {lines_read} != kept {kept_n} + rejected {n_rejects}")
        log.info("paraphrase: read %d lines = kept %d + rejected %d (%s)", lines_read, kept_n, n_rejects, counts)
        return {
            "kind": "paraphrase",
            "counts": {
                "lines_read": lines_read,
                "kept": kept_n,
                "rejected": n_rejects,
                "rejected_by_reason": dict(sorted(counts.items())),
                "pairs": n_pairs,
                "queries": distinct_count(tmp / "pairs", "query"),
                "titles": n_titles,
            },
            "outputs": {"pairs": "pairs/", "titles": "titles/", "rejects": "rejects/"},
        }

    # Published as stage "clean": downstream jobs read it as they read cleaned click data.
    with cluster_errors(out):
        return publish(out, "clean", code_fingerprint(__name__), inputs, asdict(cfg), build, force)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm paraphrase`'s options: the input and output, ParaphraseConfig's fields, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument("--input", required=True, help="sentence-pair file (plain or .gz)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    add_config_options(p, ParaphraseConfig)
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm paraphrase`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(ParaphraseConfig, args)
    m = paraphrase(LazySpark(args.master, "dssm-paraphrase"), args.input, args.out, cfg, force=args.force)
    c = m["counts"]
    print(
        f"read {c['lines_read']:,} lines = kept {c['kept']:,} + rejected {c['rejected']:,}; "
        f"{c['pairs']:,} distinct sentence pairs -> {args.out}"
    )
