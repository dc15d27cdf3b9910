"""The judge stage's settings: how clicks become grades, and how much traffic a grade needs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from core.errors import DssmError

Split = Literal["time", "query"]
SPLITS = get_args(Split)


@dataclass(frozen=True)
class JudgeConfig:
    # grade by clicks over expected examinations (Σ θ(rank) of the propensity stage's curve: the title's
    # attractiveness under the position-based model); false: clicks over impressions (raw CTR)
    debias: bool = True
    min_shown: int = 3  # a title shown fewer times for a query is left out of its judged titles
    min_impressions: int = 5  # a query with fewer impressions is left out
    min_propensity: float = 0.05  # floor on θ(rank): a click deep down weighs at most 20 times one at rank 1
    # windowed runs: the judged set a night grades is kept, the evaluation set of this many nights (its own
    # included), so their models are compared on one set; then the next night grades a new one (0 or 1: nightly)
    keep_nights: int = 7
    # windowed runs: "time" grades the set from the window's last day, which no stage that training reads
    # sees while the set is in use (a one-day window: "query"); "query": from every day of the window. Both
    # evaluate on PROTOCOL.md §3's test queries only, which training never reads
    split: Split = "time"


NIGHTLY = ("keep_nights", "split")  # how a windowed run uses its sets: the flow's business, not `dssm judge`'s


def grading(cfg: JudgeConfig) -> dict[str, Any]:
    """The settings a judged set is graded with: its output's key (a set is graded anew when they change)."""
    return {k: v for k, v in asdict(cfg).items() if k not in NIGHTLY}


def check_config(cfg: JudgeConfig) -> None:
    if cfg.min_shown < 1 or cfg.min_impressions < 1 or not 0 < cfg.min_propensity <= 1 or cfg.keep_nights < 0:
        raise DssmError(
            "judge: need min_shown >= 1, min_impressions >= 1, 0 < min_propensity <= 1 and keep_nights >= 0"
        )
    if cfg.split not in SPLITS:
        raise DssmError(f"judge.split must be one of {', '.join(SPLITS)}, got {cfg.split!r}")
