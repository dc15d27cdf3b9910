"""The vocab stage's settings: the trigram and word vocabularies' sizes and count floors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from core.config import Between


@dataclass(frozen=True)
class VocabConfig:
    min_count: int = 2  # trigrams seen fewer times are <unk>
    max_size: Annotated[int, Between(2, 100_000_000)] = 50_000  # trigram ids, <unk> included
    word_min_count: int = 2  # words seen fewer times are <unk>
    word_max_size: Annotated[int, Between(2, 100_000_000)] = 100_000  # word ids, <unk> included
