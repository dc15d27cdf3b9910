"""`dssm vocab`: letter-trigram and word vocabularies from the cleaned click data.

Counted over the distinct queries of the clicked pairs and the titles of the title pool (train
data only: test queries never reach the logs), one count per occurrence in those texts.
Ids are deterministic: by count descending, then token ascending, from 1; id 0 is `<unk>`, whose
count is the occurrences of every token left out by `min_count` or `max_size`.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from core.artifacts import code_fingerprint, publish, require_manifest
from core.schemas import VOCAB
from core.spark import cluster_errors, write_parquet
from core.spark.heldout import train_queries
from core.text import WORD_BOUNDARY
from stages.vocab.config import VocabConfig

log = logging.getLogger(__name__)
UNKNOWN = "<unk>"


def texts(pairs: DataFrame, titles: DataFrame) -> DataFrame:
    """The normalised texts the vocabularies count over (column `text`)."""
    return (
        pairs.select(F.col("query").alias("text")).distinct().unionByName(titles.select(F.col("title").alias("text")))
    )


def word_counts(text: DataFrame) -> DataFrame:
    words = text.select(F.explode(F.split("text", " ")).alias("token")).where(F.col("token") != "")
    return words.groupBy("token").count()


def trigram_counts(text: DataFrame) -> DataFrame:
    """Counts of `core.text.word_trigrams` over every word: '#'-padded, sliding windows of 3."""
    padded = F.concat(F.lit(WORD_BOUNDARY), F.col("word"), F.lit(WORD_BOUNDARY))
    words = text.select(F.explode(F.split("text", " ")).alias("word")).where(F.col("word") != "")
    grams = words.select(
        F.explode(F.transform(F.sequence(F.lit(1), F.length("word")), lambda i: F.substring(padded, i, 3))).alias(
            "token"
        )
    )
    return grams.groupBy("token").count()


def build_vocab(counts: DataFrame, min_count: int, max_size: int) -> DataFrame:
    """(id, token, count) with deterministic ids and <unk> at id 0 holding the left-out mass."""
    if max_size < 2:
        raise ValueError("max_size must leave room for <unk> and one token")
    ranked = (
        counts.where(F.col("count") >= min_count)
        .select("token", "count", F.row_number().over(Window.orderBy(F.desc("count"), "token")).alias("id"))
        .where(F.col("id") < max_size)
    )
    total = counts.agg(F.coalesce(F.sum("count"), F.lit(0)).alias("n"))
    kept = ranked.agg(F.coalesce(F.sum("count"), F.lit(0)).alias("k"))
    unknown = total.crossJoin(kept).select(
        F.lit(0).alias("id"), F.lit(UNKNOWN).alias("token"), (F.col("n") - F.col("k")).alias("count")
    )
    return unknown.unionByName(ranked.select("id", "token", "count"))


def _summary(vocab: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    table = pq.read_table(vocab)
    counts = table.column("count").to_pylist()
    total = sum(counts)
    return {
        "size": table.num_rows,
        "occurrences": total,
        "coverage": round(1 - counts[table.column("id").to_pylist().index(0)] / total, 6) if total else 0.0,
    }


def vocab(
    spark: SparkSession, clean_dir: Path, out: Path, cfg: VocabConfig = VocabConfig(), force: bool = False
) -> dict[str, Any]:
    upstream = require_manifest(clean_dir, "clean")
    inputs = {"clean": {"path": str(clean_dir), "sha256": upstream["content_sha256"]}}

    def build(tmp: Path) -> dict[str, Any]:
        pairs = train_queries(spark.read.parquet(str(clean_dir / "pairs")), upstream)  # no test query's text
        text = texts(pairs, spark.read.parquet(str(clean_dir / "titles")))
        summary = {}
        for name, counts, min_count, max_size in [
            ("trigrams", trigram_counts(text), cfg.min_count, cfg.max_size),
            ("words", word_counts(text), cfg.word_min_count, cfg.word_max_size),
        ]:
            counts = counts.persist()  # read three times by build_vocab and once for the candidates
            table = build_vocab(counts, min_count, max_size).orderBy("id")
            write_parquet(table, tmp / name, VOCAB, partitions=1)
            summary[name] = {
                **_summary(tmp / name),
                "min_count": min_count,
                "max_size": max_size,
                "candidates": counts.count(),
            }
            counts.unpersist()
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(
            "vocab: %d trigrams (coverage %.4f), %d words (coverage %.4f)",
            summary["trigrams"]["size"],
            summary["trigrams"]["coverage"],
            summary["words"]["size"],
            summary["words"]["coverage"],
        )
        return {"counts": summary, "outputs": {"trigrams": "trigrams/", "words": "words/", "summary": "summary.json"}}

    code = code_fingerprint(__name__)
    with cluster_errors(out):
        return publish(out, "vocab", code, inputs, asdict(cfg), build, force, upstream=[upstream])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm vocab`'s options: the input and output, VocabConfig's fields, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output directory")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    add_config_options(p, VocabConfig)
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm vocab`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(VocabConfig, args)
    m = vocab(LazySpark(args.master, "dssm-vocab"), args.clean, args.out, cfg, args.force)
    c = m["counts"]
    print(f"{c['trigrams']['size']:,} trigrams, {c['words']['size']:,} words -> {args.out}")
