"""The propensity stage's settings: the ranks estimated and the EM's stopping rule."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PropensityConfig:
    max_rank: int = 10  # ranks estimated; results shown lower are left out
    min_shown: int = 10  # leave out pairs shown fewer times (their attractiveness overfits)
    iterations: int = 2_000  # EM iterations at most
    tolerance: float = 1e-7  # EM stops when no rank's examination moves more than this
