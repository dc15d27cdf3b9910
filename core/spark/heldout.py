"""PROTOCOL.md §3's query split as a Spark expression: the test queries a team's own log holds are
held out of every data stage that training reads (vocab, propensity and negatives, and through
them mine, teacher and train); only the judge stage grades them (stages/judge/)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def test_query_column(query: Column) -> Column:
    """core.text.is_test_query of an already normalised query column: md5(q) % 5 == 0. As 16 ≡ 1
    (mod 5), a hex number is congruent mod 5 to the sum of its digits, which needs no 128-bit integer."""
    digits = F.split(F.md5(query), "")
    total = F.aggregate(digits, F.lit(0), lambda acc, d: acc + F.coalesce(F.conv(d, 16, 10).cast("int"), F.lit(0)))
    return total % 5 == 0


def train_queries(rows: DataFrame, upstream: dict[str, Any] | None = None, column: str = "query") -> DataFrame:
    """`rows` of train queries only (`column` normalised, as clean writes it). Sentence pairs (`dssm
    paraphrase`, an `upstream` manifest of kind paraphrase) have no queries to split: all are kept."""
    if upstream is not None and upstream.get("kind") == "paraphrase":
        return rows
    return rows.where(~test_query_column(F.col(column)))
