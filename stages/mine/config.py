"""The mine stage's settings: the share of negatives mined, their source and rank window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["index", "bm25"]


@dataclass(frozen=True)
class MineConfig:
    hard: float = 0.0  # share of each train row's negatives replaced by mined titles; 0: no mining stage
    source: Source = "index"  # index: an earlier run's index and its model; bm25: BM25 over the same titles
    min_rank: int = 10  # first rank (1-based) a mined title may come from: the top holds likely unjudged positives
    max_rank: int = 100  # last rank a mined title may come from
    relative_margin: float = 0.05  # source=index: drop titles whose cosine > (1 − this) × the positive's
    seed: int = 13  # seed of the hash that orders each row's candidates
