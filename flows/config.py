"""One typed config per retrain run: nested per-stage sections, defaults < YAML < KEY=VALUE.

`dssm run --config run.yaml negatives.seed=7 train.optim.lr=0.05` resolves it like the training
config (core/config.py): unknown keys are an error, values take the field's type. The stage
sections are the stages' own config dataclasses, each in its stage's folder (stages/NAME/config.py), so a
new stage option is one field in its stage's dataclass and is at once settable here, shown in the
Prefect UI, saved in WORKDIR/report.json and logged to MLflow. A section's module may hold
`check_config(section)`, the one settings check, which `check_config(run config)` calls for every
section before any stage runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from core.config import apply, flat, load, nest, parse_overrides
from core.errors import DssmError
from core.judgments import JudgedSetSpec
from core.options import leaves
from service.config import ServeConfig
from stages.analyze.config import AnalyzeConfig
from stages.clean.config import CleanConfig
from stages.evaluate.config import EvaluateStageConfig
from stages.gate.config import GateStageConfig
from stages.index.config import IndexConfig
from stages.judge.config import JudgeConfig
from stages.mine.config import MineConfig
from stages.negatives.config import NegativesConfig
from stages.propensity.config import PropensityConfig
from stages.simulate.config import SimulationConfig
from stages.teacher.config import TeacherConfig
from stages.train.config import TrainConfig
from stages.vocab.config import VocabConfig


@dataclass
class JudgmentsSection:
    path: str = ""  # a judged set (CSV/TSV or a .zip of one); empty: the embedded default catalogue
    spec: JudgedSetSpec = field(default_factory=JudgedSetSpec)


@dataclass
class RunConfig:
    workdir: str = "work"  # where stage outputs go (core/layout.py names each stage's directory)
    # raw logs to ingest instead of simulating (file, dir or glob); without judgments.path they are evaluated on
    # a judged set graded from their own clicks (the judge stage)
    logs: str = ""
    window_days: int = 0  # > 0: logs are dt=YYYY-MM-DD partitions; train on the last N days up to run_date
    run_date: str = ""  # YYYY-MM-DD the window ends on (windowed runs); empty: today in UTC
    judgments: JudgmentsSection = field(default_factory=JudgmentsSection)
    simulate: SimulationConfig = field(default_factory=SimulationConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    propensity: PropensityConfig = field(default_factory=PropensityConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    mine: MineConfig = field(default_factory=MineConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateStageConfig = field(default_factory=EvaluateStageConfig)
    gate: GateStageConfig = field(default_factory=GateStageConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    analyze: AnalyzeConfig = field(default_factory=AnalyzeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)  # `dssm serve --config RUN.yaml` (the flow runs no server)
    # optional stages not to run, by name: mine, teacher, index, analyze (`dssm run --help` marks them)
    skip: list[str] = field(default_factory=list)
    mlflow_uri: str = ""  # default: $MLFLOW_TRACKING_URI, else sqlite WORKDIR/mlflow.db
    spark_master: str = ""  # default: $DSSM_SPARK_MASTER, else local[*]
    force: bool = False  # recompute every stage

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def window(self) -> list[str]:
        """The dates a windowed run reads, oldest first; empty when the run is not windowed."""
        if not self.window_days:
            return []
        from datetime import datetime

        from core.dates import window_dates

        return window_dates(self.run_date or datetime.now(UTC).date().isoformat(), self.window_days)

    def flat(self) -> dict[str, Any]:
        return flat(self)

    def judged_by_clicks(self) -> bool:
        """Ingested logs without a judged set are evaluated on one the judge stage grades from their clicks
        (which needs clean's impressions/)."""
        return bool(self.logs) and not self.judgments.path and self.clean.impressions

    def absolute(self) -> RunConfig:
        """Paths made absolute: scheduled runs start in subprocesses whose cwd is not the user's."""
        from dataclasses import replace

        def resolved(p: str) -> str:
            return str(Path(p).resolve()) if p and "://" not in p else p

        return replace(
            self,
            workdir=resolved(self.workdir),
            logs=resolved(self.logs),
            index=replace(self.index, catalogue=resolved(self.index.catalogue)),
            judgments=replace(self.judgments, path=resolved(self.judgments.path)),
        )


def _refuse_unknown_keys(cls: type) -> None:
    """Prefect validates a deployment's `config` with pydantic, which drops unknown keys of a dataclass
    by default: a stale key (such as the old `train.overrides`) would then run with defaults unnoticed."""
    import typing

    cls.__pydantic_config__ = {"extra": "forbid"}
    for hint in typing.get_type_hints(cls).values():
        if dataclasses.is_dataclass(hint):
            _refuse_unknown_keys(hint)


_refuse_unknown_keys(RunConfig)


def load_run_config(
    path: Path | None = None, overrides: list[str] | None = None, options: dict[str, Any] | None = None
) -> RunConfig:
    """Defaults < the YAML file < `options` (the CLI flags given) < KEY=VALUE overrides, validated."""
    cfg = load(RunConfig(), path)
    cfg = apply(cfg, options or {})
    cfg = apply(cfg, parse_overrides(overrides or []))
    check_config(cfg)
    return settled(cfg)


def settled(cfg: RunConfig) -> RunConfig:
    """The rules between sections, applied once for the run so that each stage reads its own section only:
    the gate compares what the evaluation measured, so a retrieval gate metric turns evaluate.retrieval on."""
    from dataclasses import replace

    if cfg.gate.metric == "retrieval_ndcg@10" and not cfg.evaluate.retrieval:
        return replace(cfg, evaluate=replace(cfg.evaluate, retrieval=True))
    return cfg


# The flags of `dssm run`/`dssm schedule`: shorthands for the common config keys, applied only when
# given; their help and default come from the key's field. Every other key is a KEY=VALUE.
_FLAGS: dict[str, str] = {
    "--workdir": "workdir",
    "--logs": "logs",
    "--judgments": "judgments.path",
    "--query-col": "judgments.spec.query_col",
    "--title-col": "judgments.spec.title_col",
    "--label-col": "judgments.spec.label_col",
    "--encoding": "judgments.spec.encoding",
    "--window-days": "window_days",
    "--run-date": "run_date",
    "--impressions": "simulate.impressions",
    "--seed": "simulate.seed",
    "--shards": "simulate.shards",
    "--workers": "simulate.workers",
    "-n": "negatives.n",
    "--models": "train.models",
    "--epochs": "train.epochs",
    "--nproc": "train.nproc",
    "--baselines": "evaluate.baselines",
    "--mlflow-uri": "mlflow_uri",
    "--master": "spark_master",
    "--catalogue": "index.catalogue",
}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm run`/`dssm schedule`: --config, KEY=VALUE overrides, and flags for the common keys."""
    from core.options import converter

    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="run config keys, e.g. negatives.seed=7 train.optim.lr=0.05"
    )
    p.add_argument("--config", type=Path, help="YAML run config (defaults < file < flags < KEY=VALUE)")
    g = p.add_argument_group("shorthands for config keys (docs/flows.md lists every key)")
    run_keys = {key: (default, text, hint) for key, default, hint, text in leaves(RunConfig)}
    for flag, key in _FLAGS.items():
        default, text, hint = run_keys[key]
        shown = ",".join(default) if isinstance(default, list) else default
        g.add_argument(
            flag,
            dest=key,
            default=argparse.SUPPRESS,
            type=converter(hint, key),
            metavar=key.rsplit(".", 1)[-1].upper(),
            help=f"{text} [{key}; default: {shown!r}]".replace("%", "%%"),
        )
    g.add_argument(
        "--train",
        dest="train_overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="training config keys without their train. prefix, e.g. --train optim.lr=0.05 epochs=10 (put other "
        "KEY=VALUEs before it)",
    )
    from flows.pipeline import optional_stages

    for stage in optional_stages():  # shorthands for naming a stage in `skip`
        g.add_argument(
            f"--no-{stage}", dest="skips", action="append_const", const=stage, help=f"skip the {stage} stage [skip]"
        )
    g.add_argument("--force", dest="force", action="store_true", default=argparse.SUPPRESS, help=run_keys["force"][1])


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config of `dssm run`/`dssm schedule`: only the flags actually given take part."""
    keys = set(_FLAGS.values()) | {"force"}
    options = nest({key: getattr(args, key) for key in keys & set(vars(args))})
    overrides = [*args.overrides, *(f"train.{pair}" for pair in getattr(args, "train_overrides", []))]
    cfg = load_run_config(args.config, overrides, options)
    from dataclasses import replace

    return replace(cfg, skip=list(dict.fromkeys([*cfg.skip, *(getattr(args, "skips", None) or [])])))


def check_config(cfg: RunConfig) -> None:
    """The whole run config, before any stage runs: each section by its module's `check_config`, then the
    run's own keys."""
    from flows.pipeline import optional_stages

    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        check = getattr(sys.modules.get(type(value).__module__), "check_config", None)
        if dataclasses.is_dataclass(value) and check not in (None, check_config):  # a stage's, not this one
            check(value)
    unknown = [s for s in cfg.skip if s not in optional_stages()]
    if unknown:
        optional = ", ".join(optional_stages())
        raise DssmError(f"skip: {', '.join(unknown)} cannot be skipped; the optional stages: {optional}")
    if cfg.simulate.impressions < 1:
        raise DssmError(f"simulate.impressions must be positive, got {cfg.simulate.impressions}")
    if cfg.window_days < 0:
        raise DssmError(f"window_days must be >= 0, got {cfg.window_days}")
    cfg.window()  # a bad run_date fails here
