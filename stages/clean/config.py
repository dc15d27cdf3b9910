"""The clean stage's settings: the bot and malformed-line rules, the input's format and reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from core.config import Between


@dataclass(frozen=True)
class CleanConfig:
    bot_max_per_minute: int = 20  # a user with more impressions in any 60 seconds is a bot
    bot_min_impressions: int = 10  # ... or with at least this many impressions
    bot_min_click_rate: float = 0.8  # ... clicking at least this share of shown results
    max_malformed_rate: float = 0.5  # refuse input with a larger share of malformed lines
    rows_per_file: Annotated[int, Between(1_000, 1_000_000_000)] = 1_000_000  # rows per output Parquet file, about
    # write impressions/ (what `dssm propensity` and `negatives --skip-above` read); --no-impressions: a
    # faster clean (the kept lines are still read, to count the pairs, but not written)
    impressions: bool = True
    # v2 logs: the catalogue side table (Parquet: doc_id, title); empty: a simulate output's own, if any
    catalogue: str = ""
    # json (JSON lines) or parquet (a Parquet table); auto: what the input's files are (remote: by the path's suffix)
    input_format: Literal["auto", "json", "parquet"] = "auto"
    # Parquet input: the table's column for a field, where its name differs, e.g. query=search_terms,ts=event_time
    columns: dict[str, str] = field(default_factory=dict)
    # auto: local files are read by Python tasks (small files share one), without the JVM (stages/clean/filetasks.py);
    # spark: Spark's readers always (what auto does for hdfs://, s3a://, globs and result rows)
    reader: Literal["auto", "spark"] = "auto"
