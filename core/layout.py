"""Where every stage of a work dir lives: the one place that names `WORKDIR/negatives` and friends.

`output(NAME)` is where stage NAME of flows/pipeline.py's PIPELINE writes (`Earlier(NAME)` reads it):
WORKDIR/NAME, or the name older work dirs have for it (OLDER_NAMES), so a new stage needs no entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OLDER_NAMES = {"mine": "mined", "evaluate": "eval", "analyze": "analysis"}  # stage -> its directory's name


@dataclass(frozen=True)
class Layout:
    workdir: Path

    def __init__(self, workdir: str | Path):
        object.__setattr__(self, "workdir", Path(workdir))

    def output(self, stage: str) -> Path:
        """Where stage `stage` writes its one output directory."""
        return self.workdir / OLDER_NAMES.get(stage, stage)

    @property
    def simulate(self) -> Path:
        return self.workdir / "simulate"

    @property
    def logs(self) -> Path:
        """Simulated logs in date partitions (dt=YYYY-MM-DD), one appended per run date."""
        return self.workdir / "logs"

    @property
    def clean(self) -> Path:
        return self.workdir / "clean"

    @property
    def clean_days(self) -> Path:
        """Windowed runs: each day's clean output, cached by that day's bytes."""
        return self.workdir / "clean-days"

    @property
    def propensity(self) -> Path:
        return self.workdir / "propensity"

    @property
    def vocab(self) -> Path:
        return self.workdir / "vocab"

    @property
    def negatives(self) -> Path:
        return self.workdir / "negatives"

    @property
    def mine(self) -> Path:
        """The negatives with mined hard ones (`dssm mine`)."""
        return self.output("mine")

    @property
    def teacher(self) -> Path:
        """The negatives with teacher lists on hard candidates (`dssm teacher`)."""
        return self.workdir / "teacher"

    def train(self, encoder: str) -> Path:
        """A training run directory: checkpoints of one encoder."""
        return self.workdir / "train" / encoder

    @property
    def warm_start(self) -> Path:
        """Windowed runs: the champion checkpoints models warm-start from, and which one each data version used."""
        return self.workdir / "warm-start"

    @property
    def evaluate(self) -> Path:
        return self.output("evaluate")

    @property
    def index(self) -> Path:
        return self.workdir / "index"

    @property
    def analyze(self) -> Path:
        return self.output("analyze")

    @property
    def report(self) -> Path:
        return self.workdir / "report.json"

    @property
    def lock(self) -> Path:
        return self.workdir / ".lock"

    @property
    def mlflow_db(self) -> Path:
        return self.workdir / "mlflow.db"
