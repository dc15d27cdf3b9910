"""One typed config per retrain run: nested per-stage sections, defaults < YAML < KEY=VALUE.

`dssm run --config run.yaml negatives.seed=7 train.epochs=10` resolves it like the training config
(core/config.py): unknown keys are an error, values take the field's type. The stage sections are
the stages' own config dataclasses, so a new stage option is one field in its stage's dataclass and
is at once settable here, shown in the Prefect UI, saved in WORKDIR/report.json and logged to MLflow.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from core.config import apply, flat, load, parse_overrides
from core.errors import DssmError
from core.judgments import JudgedSetSpec
from jobs.clean import CleanConfig
from jobs.negatives import NegativesConfig
from jobs.propensity import PropensityConfig
from jobs.simulate import SimulationConfig
from jobs.vocab import VocabConfig
from retrieval.index import IndexConfig


@dataclass
class JudgmentsSection:
    path: str = ""  # a judged set (CSV/TSV or a .zip of one); empty: the embedded default catalogue
    spec: JudgedSetSpec = field(default_factory=JudgedSetSpec)


@dataclass
class TrainSection:
    models: list[str] = field(default_factory=list)  # encoders trained side by side; empty: the config's (lstm)
    epochs: int = 0  # 0: the training config's
    overrides: list[str] = field(default_factory=list)  # training config KEY=VALUE (docs/training.md)
    nproc: int = 0  # processes under torchrun; 0: one per GPU, else 1
    warm_start: bool = True  # windowed runs: start from the champion when compatible (docs/flows.md)
    warm_min_overlap: float = 0.5  # ... when its vocabulary holds at least this share of the new one's tokens


@dataclass
class EvaluateSection:
    baselines: list[str] = field(default_factory=lambda: ["bm25"])
    hybrid: bool = True  # also each model + BM25, the fusion weight fit on the negatives' validation queries


@dataclass
class RunConfig:
    workdir: str = "work"
    logs: str = ""  # raw logs to ingest instead of simulating (file, dir or glob); evaluation then needs judgments
    window_days: int = 0  # > 0: logs are dt=YYYY-MM-DD partitions; train on the last N days up to run_date
    run_date: str = ""  # YYYY-MM-DD the window ends on (windowed runs); empty: today in UTC
    judgments: JudgmentsSection = field(default_factory=JudgmentsSection)
    simulate: SimulationConfig = field(default_factory=SimulationConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    propensity: PropensityConfig = field(default_factory=PropensityConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    train: TrainSection = field(default_factory=TrainSection)
    evaluate: EvaluateSection = field(default_factory=EvaluateSection)
    index_champion: bool = True  # after the gate, `dssm index` the champion over the catalogue (dssm search)
    catalogue: str = ""  # titles to index: Parquet/CSV with a `title` column; empty: the clean stage's title pool
    index: IndexConfig = field(default_factory=IndexConfig)
    analyze: bool = True  # `dssm analyze` the trained recurrent model as the last stage
    mlflow_uri: str = ""  # default: $MLFLOW_TRACKING_URI, else sqlite WORKDIR/mlflow.db
    spark_master: str = ""  # default: $DSSM_SPARK_MASTER, else local[*]
    force: bool = False  # recompute every stage

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def window(self) -> list[str]:
        """The dates a windowed run reads, oldest first; empty when the run is not windowed."""
        from datetime import datetime

        from jobs.window import window_dates

        if not self.window_days:
            return []
        return window_dates(self.run_date or datetime.now(UTC).date().isoformat(), self.window_days)

    def flat(self) -> dict[str, Any]:
        return flat(self)

    def absolute(self) -> RunConfig:
        """Paths made absolute: scheduled runs start in subprocesses whose cwd is not the user's."""
        from dataclasses import replace

        def resolved(p: str) -> str:
            return str(Path(p).resolve()) if p and "://" not in p else p

        return replace(
            self,
            workdir=resolved(self.workdir),
            logs=resolved(self.logs),
            catalogue=resolved(self.catalogue),
            judgments=replace(self.judgments, path=resolved(self.judgments.path)),
        )


def load_run_config(
    path: Path | None = None, overrides: list[str] | None = None, options: dict[str, Any] | None = None
) -> RunConfig:
    """Defaults < the YAML file < `options` (the CLI flags given) < KEY=VALUE overrides, validated."""
    cfg = load(RunConfig(), path)
    cfg = apply(cfg, options or {})
    cfg = apply(cfg, parse_overrides(overrides or []))
    validate(cfg)
    return cfg


# The flags of `dssm run`/`dssm schedule`: shorthands for config keys, applied only when given. Their
# values stay text: the config loader converts them by the key's type (10_000, lstm,rnn), as for KEY=VALUE.
_FLAGS: list[tuple[tuple[str, ...], str, dict[str, Any], str]] = [
    (("--workdir",), "workdir", {}, "where stage outputs go"),
    (("--logs",), "logs", {}, "raw click logs to ingest instead of simulating (file, dir or glob)"),
    (("--judgments",), "judgments.path", {}, "judged set (CSV/TSV or a .zip of one); default: the embedded catalogue"),
    (("--query-col",), "judgments.spec.query_col", {}, "query column of the judged set"),
    (("--title-col",), "judgments.spec.title_col", {}, "title column of the judged set"),
    (("--label-col",), "judgments.spec.label_col", {}, "label column of the judged set"),
    (("--encoding",), "judgments.spec.encoding", {}, "the judged set's encoding"),
    (("--window-days",), "window_days", {}, "train on the last N days of dt=YYYY-MM-DD log partitions (0: all logs)"),
    (("--run-date",), "run_date", {}, "the day a windowed run ends on, YYYY-MM-DD (empty: today in UTC)"),
    (("--impressions",), "simulate.impressions", {}, "impressions to simulate (per day in windowed runs)"),
    (("--seed",), "simulate.seed", {}, "simulation seed"),
    (("--shards",), "simulate.shards", {}, "simulated log files (0: one per 250k impressions)"),
    (("--workers",), "simulate.workers", {}, "simulation processes (0: CPUs)"),
    (("-n",), "negatives.n", {}, "negatives per pair"),
    (("--models",), "train.models", {}, "encoders trained side by side, e.g. lstm,rnn,dssm"),
    (("--epochs",), "train.epochs", {}, "training epochs (0: the training config's)"),
    (("--train",), "train.overrides", {"nargs": "+", "metavar": "KEY=VALUE"}, "training config overrides"),
    (("--nproc",), "train.nproc", {}, "training processes under torchrun (0: one per GPU, else 1)"),
    (("--baselines",), "evaluate.baselines", {}, "baselines beside the model (bm25,doc2vec,ulm,..)"),
    (("--mlflow-uri",), "mlflow_uri", {}, "MLflow tracking URI (empty: $MLFLOW_TRACKING_URI, else WORKDIR/mlflow.db)"),
    (("--master",), "spark_master", {}, "Spark master URL (default: $DSSM_SPARK_MASTER, else local[*])"),
    (("--catalogue",), "catalogue", {}, "titles to index (Parquet/CSV, `title` column); default: the clean title pool"),
]


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm run`/`dssm schedule`: --config, KEY=VALUE overrides, and flags for the common keys."""
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="run config overrides, e.g. negatives.seed=7")
    p.add_argument("--config", type=Path, help="YAML run config (defaults < file < flags < KEY=VALUE)")
    defaults = flat(RunConfig())
    g = p.add_argument_group("shorthands for config keys (docs/flows.md lists every key)")
    for names, key, kwargs, text in _FLAGS:
        shown = defaults[key]
        shown = ",".join(shown) if isinstance(shown, list) else shown
        text = f"{text} [{key}; default: {shown!r}]"
        kwargs = {"metavar": key.rsplit(".", 1)[-1].upper(), **kwargs}
        g.add_argument(*names, dest=key, default=argparse.SUPPRESS, help=text, **kwargs)
    g.add_argument(
        "--no-analyze", dest="analyze", action="store_false", default=argparse.SUPPRESS, help="skip the analyze stage"
    )
    g.add_argument(
        "--no-index",
        dest="index_champion",
        action="store_false",
        default=argparse.SUPPRESS,
        help="skip the index stage (the champion's ANN index)",
    )
    g.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help="recompute every stage")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config of `dssm run`/`dssm schedule`: only the flags actually given take part."""
    keys = {key for _, key, _, _ in _FLAGS} | {"analyze", "index_champion", "force"}
    options: dict[str, Any] = {}
    for key in keys & set(vars(args)):
        node = options
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = getattr(args, key)
    return load_run_config(args.config, args.overrides, options)


def validate(cfg: RunConfig) -> None:
    from modeling.config import load_config

    load_config(None, cfg.train.overrides)  # an unknown or bad training key fails before any stage runs
    from modeling.encoders import ENCODERS

    unknown = [m for m in cfg.train.models if m not in ENCODERS]
    if unknown:
        raise DssmError(f"train.models: unknown encoder(s) {', '.join(unknown)}; choose from {', '.join(ENCODERS)}")
    from evaluation.systems import parse_baselines

    parse_baselines(",".join(cfg.evaluate.baselines))
    from retrieval.index import check_config

    check_config(cfg.index)
    if cfg.catalogue and "://" not in cfg.catalogue and not Path(cfg.catalogue).exists():
        raise DssmError(f"catalogue {cfg.catalogue}: not found")
    if cfg.simulate.impressions < 1:
        raise DssmError(f"simulate.impressions must be positive, got {cfg.simulate.impressions}")
    if cfg.window_days < 0:
        raise DssmError(f"window_days must be >= 0, got {cfg.window_days}")
    cfg.window()  # a bad run_date fails here
    if cfg.train.nproc < 0 or cfg.train.epochs < 0:
        raise DssmError("train.nproc and train.epochs must be >= 0")
