"""The negatives stage's settings: negatives per pair, the split, debiasing and listwise targets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from core.config import Between

ListTargets = Literal["ratio", "map"]
LIST_TARGETS = get_args(ListTargets)


@dataclass(frozen=True)
class NegativesConfig:
    n: Annotated[int, Between(0, 1_000)] = 4  # negatives per pair; 0 for `dssm train --objective paraphrase`
    seed: int = 13  # seed of the negative draws and of the train/validation split
    valid_fraction: Annotated[float, Between(0, 0.9)] = 0.1  # share of queries held out for validation
    shards: Annotated[int, Between(1, 4_096)] = 8  # train files (the trainer's ranks stream disjoint files)
    skip_above: float = 0.0  # share of each row's negatives taken from titles shown above the click and skipped
    # weigh clicks by 1/examination of their rank (for loss.pair_weight=ipw|log_ipw and the listwise
    # targets); needs `dssm propensity`'s curve (--propensity)
    debias: bool = False
    min_propensity: float = 0.05  # examination is raised to this at least, capping a click's weight at 1/this
    # shown titles per query with listwise targets, for loss.listwise; 0: none
    list_size: Annotated[int, Between(0, 1_000)] = 0
    # the lists' relevance: ratio (clicks / expected examinations) or map (the position-based model's
    # attractiveness, with a Beta prior)
    list_targets: ListTargets = "ratio"
    # map's Beta prior: as many clicks in prior_clicks + prior_skips examinations (chosen on dev:
    # docs/training.md)
    prior_clicks: float = 0.5
    prior_skips: float = 8.0  # map's Beta prior: as many examinations without a click
