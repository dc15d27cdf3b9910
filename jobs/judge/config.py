"""The judge stage's settings: how clicks become grades, and how much traffic a grade needs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import DssmError
from core.judgments import JudgedSet, JudgedSetSpec

if TYPE_CHECKING:
    from core.stage import StageOutput


@dataclass(frozen=True)
class JudgeConfig:
    # grade by clicks over expected examinations (Σ θ(rank) of the propensity stage's curve: the title's
    # attractiveness under the position-based model); false: clicks over impressions (raw CTR)
    debias: bool = True
    min_shown: int = 3  # a title shown fewer times for a query is left out of its judged titles
    min_impressions: int = 5  # a query with fewer impressions is left out
    min_propensity: float = 0.05  # floor on θ(rank): a click deep down weighs at most 20 times one at rank 1


def check_config(cfg: JudgeConfig) -> None:
    if cfg.min_shown < 1 or cfg.min_impressions < 1 or not 0 < cfg.min_propensity <= 1:
        raise DssmError("judge: need min_shown >= 1, min_impressions >= 1 and 0 < min_propensity <= 1")


JUDGED_FILE = "judged.csv"  # in the judge stage's output directory
CLICK_SCALE = (1.0, 3.0)  # the grades' scale: never clicked .. clicked whenever examined (Home Depot's 1..3)
CLICK_RELEVANT = 2.5  # the midpoint of the scale, as Home Depot's: what counts as relevant for MRR, MAP and recall
CLICK_SPEC = JudgedSetSpec(encoding="utf-8")  # how judged.csv is written and read: Home Depot's column names, UTF-8


def click_judged_set(output: str | Path, sha256: str, name: str) -> JudgedSet:
    """The judged set a judge stage wrote to `output` (judged.csv's sha256; "" before it is written),
    read as it was written: Home Depot's column names, UTF-8."""
    return JudgedSet(str(Path(output) / JUDGED_FILE), CLICK_SPEC, sha256, name, graded_from="clicks")


def judged_set(run_judged: JudgedSet, judge: StageOutput | None) -> JudgedSet:
    """What a stage evaluates on: the run's judged set, or the one the judge stage graded (named as the run's)."""
    if judge is None:
        return run_judged
    from core.artifacts import read_manifest

    hashes = read_manifest(Path(judge.path))["file_sha256"]  # judged.csv's own, as `dssm evaluate` of it hashes it
    return click_judged_set(judge.path, hashes[JUDGED_FILE], run_judged.name)


def clicks_dataset_name(logs: str) -> str:
    """The name of the judged set graded from `logs` (a file, dir or glob): its MLflow experiment and
    `dataset` tag, e.g. /data/search-logs/*.jsonl.gz -> search-logs-clicks."""
    path = Path(logs)
    while path.name and any(c in path.name for c in "*?["):
        path = path.parent
    stem = path.name.split(".")[0] if path.is_file() or "." in path.name else path.name
    return f"{stem or 'logs'}-clicks"
