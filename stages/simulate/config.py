"""The simulate stage's settings: the click model, the dirt rates, the log's size, format and day."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC
from typing import Annotated, Literal, get_args

from core.config import Between
from core.errors import DssmError

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PromotedBrands = Literal["hashed", "weakest"]
PROMOTED_BRANDS = get_args(PromotedBrands)


@dataclass(frozen=True)
class ClickModel:
    """Parameters of the production ranker and the position-based click model."""

    zipf_exponent: float = 1.0  # popularity of the query at popularity rank r is ∝ r**-s
    ranker_noise: float = 0.35  # std of the production ranker's score noise, relevance in [0, 1]
    # std of the ranker's persistent error per (query, title): the same mistakes on every impression,
    # so clicks uncorrected for position follow the ranker's mistakes
    ranker_bias: float = 0.0
    # added to the ranker's score of titles of promoted brands (a quarter of the first words): a
    # systematic ranker error, which a model learning from uncorrected clicks carries to new queries
    promotion: float = 0.0
    # which brands `promotion` lifts: a hashed quarter of the first words, unrelated to relevance, or
    # the weakest brands (lowest mean label, a quarter of the titles: learning the promotion costs relevance)
    promoted_brands: PromotedBrands = "hashed"
    page_size: Annotated[int, Between(1, 1_000)] = 10  # results shown per impression
    filler: Annotated[int, Between(0, 1_000)] = 2  # random unjudged titles (relevance 0) mixed into each candidate list
    eta: float = 1.0  # examination at rank r is r**-eta
    attract_min: float = 0.05  # click probability of an examined, irrelevant title
    attract_max: float = 0.85  # click probability of an examined title of the top label
    dwell_base_ms: float = 5_000.0  # median dwell of an irrelevant click
    dwell_gain_ms: float = 55_000.0  # added to the median dwell at the top label
    days: float = 30.0  # the time span the log covers, in days
    # the query mix's drift, for dated logs (`day`): each day after 2026-01-01 the popularity ranking moves this
    # share of the queries on (a rotation: the head of day d is the queries d·drift·n ranks down); 0: every day alike
    drift: float = 0.0


@dataclass(frozen=True)
class DirtRates:
    """How often each kind of dirt appears (per impression unless said otherwise)."""

    mixed_case: float = 0.30  # query typed in upper, title or random case
    extra_spaces: float = 0.10  # repeated, leading or trailing spaces in the query
    unicode_space: float = 0.03  # a no-break/thin/ideographic space instead of a space
    dirty_title: float = 0.05  # a shown title with doubled spaces or upper case
    empty_query: float = 0.01  # an empty or all-space query
    duplicate: float = 0.02  # the line is logged twice
    malformed: float = 0.005  # truncated JSON, a missing field or a wrong type
    bot_impressions: float = 0.01  # share of impressions from bots (bursts, clicks on everything)
    bot_burst: tuple[int, int] = (30, 80)  # impressions per bot burst, ~1.5 s apart


@dataclass(frozen=True)
class SimulationConfig:
    impressions: Annotated[int, Between(1, 10_000_000_000)] = 100_000  # impressions to simulate, e.g. 10_000_000
    seed: int = 13  # random seed
    shards: Annotated[int, Between(0, 4_096)] = 0  # output files; 0: one per 250k impressions
    workers: Annotated[int, Between(0, 1_024)] = 0  # parallel processes; 0: as many as CPUs (at most the shards)
    gzip: bool = True  # gzip the logs (--no-gzip: plain .jsonl)
    # 1: results carry titles; 2: doc ids, titles in OUT/catalogue.parquet (docs/raw-log-format.md)
    log_format: Literal[1, 2] = 1
    # YYYY-MM-DD: simulate that one day into the date partition OUT/dt=YYYY-MM-DD (OUT: a log root that
    # days are appended to; each day has its own seed and impression ids)
    day: str = ""
    # also simulate traffic of the test queries (PROTOCOL.md §3), as a team's own log has it: a log to give as
    # `--logs` without judgments (the judge stage grades it), or to check click grades against the judged set;
    # vocab, propensity and negatives leave those queries out of training
    test_traffic: bool = False
    model: ClickModel = field(default_factory=ClickModel)
    dirt: DirtRates = field(default_factory=DirtRates)

    def shard_count(self) -> int:
        return self.shards or max(1, -(-self.impressions // 250_000))

    def span(self) -> tuple[int, float, list[int], str]:
        """(start in ms, length in ms, extra seed words, impression id prefix) of the simulated log:
        `model.days` from 2026-01-01, or the one `day`, seeded and named by that date so that days
        appended to one log root never share an impression id."""
        if not self.day:
            return START_MS, self.model.days * 86_400_000, [], ""
        start = day_start_ms(self.day)
        return start, 86_400_000.0, [start // 86_400_000], self.day.replace("-", "") + "-"


def partition_name(day: str) -> str:
    """The directory of one day's logs under a log root (Hive-style, as Spark and most log shippers write)."""
    return f"dt={day}"


def day_start_ms(day: str) -> int:
    """Midnight UTC of a YYYY-MM-DD date, in ms; a clear error for anything else."""
    from datetime import date, datetime

    try:
        parsed = date.fromisoformat(day)
    except ValueError:
        raise DssmError(f"day must be a date YYYY-MM-DD, got {day!r}") from None
    return int(datetime(parsed.year, parsed.month, parsed.day, tzinfo=UTC).timestamp() * 1000)
