"""The analyze stage's settings, in a module that imports no pyspark, mlflow or torch: `dssm analyze`'s
flags (core/options.py) and the keyword rule the report's sections share."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import DssmError


@dataclass(frozen=True)
class KeywordRule:
    """When a word counts as read by a cell, and as a keyword (Tables I-II)."""

    top: int = 10  # the most active cells considered (the largest output at the end of the text)
    threshold: float = 0.25  # a word moves a cell when |Δy| > this × the text's largest |y| of the top cells
    share: float = 0.4  # a keyword moves more than this share of the top cells (in both directions, if bidirectional)


@dataclass(frozen=True)
class AnalyzeConfig:
    pairs: int = 3  # query/title pairs drawn from the judged set's test queries when no --pair is given
    rule: KeywordRule = field(default_factory=KeywordRule)
    topic_cells: int = 5  # Table III rows: the most active cells whose keywords are listed
    topic_queries: int = 8  # Table III columns: the queries shown for each cell
    probes: list[str] = field(default_factory=list)  # words whose doc2vec nearest words are listed (needs --judgments)


def check_config(settings: AnalyzeConfig) -> None:
    """Counts below one are refused by the flag that set them."""
    counts = {
        "pairs": settings.pairs,
        "top": settings.rule.top,
        "topic-cells": settings.topic_cells,
        "topic-queries": settings.topic_queries,
    }
    for flag, value in counts.items():
        if value < 1:
            raise DssmError(f"--{flag} must be at least 1, got {value}")
