"""The propensity stage's settings: the ranks estimated and the EM's stopping rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from core.config import Between


@dataclass(frozen=True)
class PropensityConfig:
    max_rank: Annotated[int, Between(1, 1_000)] = 10  # ranks estimated; results shown lower are left out
    min_shown: int = 10  # leave out pairs shown fewer times (their attractiveness overfits)
    iterations: Annotated[int, Between(1, 1_000_000)] = 2_000  # EM iterations at most
    tolerance: float = 1e-7  # EM stops when no rank's examination moves more than this
