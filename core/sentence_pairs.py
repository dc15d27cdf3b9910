"""Sentence-pair files (Wieting & Gimpel 2017's setting): one parser per line format, shared by the
Spark job that prepares paraphrase pairs for training (`dssm paraphrase`) and the STS evaluation.

Formats (tab-separated, one pair per line):
- `pairs`: sentence1, sentence2 (e.g. Wiki-Auto normal -> simple; no score, every pair a paraphrase)
- `sts`: score, sentence1, sentence2 (SemEval STS 2012-2016 as packaged by brmson; empty score =
  an unscored distractor)
- `stsb`: genre, file, year, id, score, sentence1, sentence2[, source columns] (STS Benchmark)
- `sick`: pair_ID, sentence_A, sentence_B, relatedness_score, entailment_judgment (SICK, a header)
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.errors import DssmError
from core.text import norm

FORMATS = ("pairs", "sts", "stsb", "sick")
# (sentence1, sentence2, score) columns; score None: the format has none
_COLUMNS = {"pairs": (0, 1, None), "sts": (1, 2, 0), "stsb": (5, 6, 4), "sick": (1, 2, 3)}


# punctuation, but not a decimal point or thousands comma between digits, nor ' or - inside words
_PUNCTUATION = re.compile(r"([^\w\s'.,-]|(?<!\d)[.,]|[.,](?!\d))")


def sentence_norm(sentence: str) -> str:
    """norm() with punctuation split from words ("tracks." -> "tracks ."), as Wiki-Auto and most
    paraphrase corpora are tokenised; training pairs and STS sentences both go through it."""
    return norm(_PUNCTUATION.sub(r" \1 ", sentence))


@dataclass(frozen=True)
class SentencePair:
    s1: str
    s2: str
    score: float | None


def parse_line(line: str, fmt: str) -> SentencePair | str:
    """The pair on one line, or the reason it is unusable (malformed, empty_sentence, no_score)."""
    i, j, k = _COLUMNS[fmt]
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) <= max(c for c in (i, j, k) if c is not None):
        return "malformed"
    s1, s2 = fields[i].strip(), fields[j].strip()
    if not s1 or not s2:
        return "empty_sentence"
    score = None
    if k is not None:
        try:
            score = float(fields[k])
        except ValueError:
            return "no_score"
    return SentencePair(s1, s2, score)


def is_header(line: str, fmt: str) -> bool:
    return fmt == "sick" and line.startswith("pair_ID\t")


def read_pairs(path: Path | str, fmt: str) -> tuple[list[SentencePair], dict[str, int]]:
    """Every usable pair of a file (plain or .gz), and how many lines were left out and why."""
    if fmt not in FORMATS:
        raise DssmError(f"unknown sentence-pair format {fmt!r}; choose from {', '.join(FORMATS)}")
    path = Path(path)
    if not path.is_file():
        raise DssmError(f"{path}: no such file")
    pairs: list[SentencePair] = []
    skipped: dict[str, int] = {}
    for line in _lines(path):
        if not line.strip() or is_header(line, fmt):
            continue
        parsed = parse_line(line, fmt)
        if isinstance(parsed, str):
            skipped[parsed] = skipped.get(parsed, 0) + 1
        else:
            pairs.append(parsed)
    return pairs, skipped


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        yield from handle
