"""`dssm paraphrase`'s settings: the sentence-pair file's format and score floor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Format = Literal["pairs", "sts", "stsb", "sick"]  # core.sentence_pairs.FORMATS


@dataclass(frozen=True)
class ParaphraseConfig:
    format: Format = "pairs"  # pairs: s1<TAB>s2; sts: score, s1, s2; stsb: STS Benchmark; sick: SICK
    min_score: float | None = None  # scored formats: keep pairs scored at least this (e.g. 4 on STS-B's 0-5)
