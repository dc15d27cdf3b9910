"""The retrain pipeline as one declarative list: what runs, in which order, on what, and when.

PIPELINE is the single description of the flow: flows/retrain.py walks it (each entry a Prefect
task), the progress bar counts it, `dssm run --help` lists it, report.json's stages follow its
order, and tests/test_pipeline.py holds docs/architecture.md's stage table to it. A stage reads
the outputs of stages before it by name, with `TrainingRows()` the output of the last stage marked
`trains_on` that ran (train's rows: the teacher's, else mine's, else the negatives'), and with
`Earlier(NAME)` what stage NAME left in the work dir from an earlier run (e.g. last night's index,
before this run's index stage rebuilds it). A stage runs unless its `when` finds nothing to do, or it
is `optional` and the run config's `skip` names it: the one way to switch a stage off.

A stage's `run` is handed its own run-config section (`settings=`, the entry's `section`). What a stage
does for the run besides its output is a hook in its `stage` module, found by name (HOOKS); the flow
names no stage.

Adding a stage: its package's `stage` module with `run(ctx, [settings,] **reads) -> StageOutput` (beside
its config and job), one entry here, one field in the run config, one row in docs/architecture.md
(the walk-through: docs/architecture.md#adding-a-stage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.stage import RunContext, StageOutput


@dataclass(frozen=True)
class TrainingRows:
    """What the models train on: the output of the last stage before the reader that is marked
    `trains_on` and ran this time (the teacher's lists, else the mined negatives, else the sampled ones),
    passed as `arg`. A new stage whose rows the models should train on is marked `trains_on`; the
    reader's entry does not change."""

    arg: str = "rows"


@dataclass(frozen=True)
class Earlier:
    """The output stage `stage` left in the work dir from an earlier run (None when there is none);
    the stage receives it as `earlier_STAGE`."""

    stage: str

    @property
    def arg(self) -> str:
        return f"earlier_{self.stage}"


def _always(ctx: RunContext) -> bool:
    return True


# What a stage's `stage` module may define besides `run`, each called by the flow for a stage that runs:
HOOKS = (
    # prepare(ctx, settings) -> RunContext, before any stage runs: what the run must decide first (judge:
    # the day held out of training, which clean already leaves out)
    "prepare",
    # log_to_training_runs(ctx, output, run_ids) -> None, after the walk: what the stage adds to the MLflow
    # runs of the models this run trained (the stages marked `trains_models`), skipped training included
    "log_to_training_runs",
    # report(output) -> dict, after the walk: the keys the stage adds to WORKDIR/report.json
    "report",
    # printed(summary) -> list[str]: the lines `dssm run` prints for the stage under its stage table, from
    # the run's summary (report.json)
    "printed",
)


@dataclass(frozen=True)
class Stage:
    name: str
    # the module whose `run(ctx, [item,] **reads)` it is (imported when the stage runs), MODULE:FUNCTION
    # for another function of it, or that function; run returns None when there is nothing to do this time
    code: str | Callable[..., StageOutput | None]
    doc: str  # one line: what it makes (dssm run --help)
    section: str = ""  # its run-config section: handed to `run` as `settings=`, shown in --help
    reads: tuple[str | TrainingRows | Earlier, ...] = ()  # earlier stages' outputs, passed by name
    when: Callable[[RunContext], bool] = _always  # whether its inputs and settings leave it anything to do
    unless: str = ""  # when it does not run (logged, and shown in --help)
    optional: bool = False  # a run switches it off by naming it in `skip` (the flags --no-index, --no-analyze)
    warn_unless: bool = False  # not running is worth a warning (an input is missing), not a choice
    each: Callable[[RunContext], list[str]] | None = None  # one task per item (train: per encoder)
    retried: bool = False  # talks to services (a Spark cluster, an MLflow server): transient failures retry
    trains_on: bool = False  # its output is what the models train on: the last such tags the run's data_version
    judges: bool = False  # its output holds the run's judged set: hashed once written, it tags the run's dataset
    # its outputs are trained models, each naming its MLflow training run (counts' mlflow_run_id): the run
    # config and the other stages' log_to_training_runs go there
    trains_models: bool = False
    then: str = ""  # what `dssm run` suggests next when the stage ran ({workdir}: the run's work dir)

    def run(self) -> Callable[..., StageOutput | None]:
        if callable(self.code):
            return self.code
        import importlib

        module, _, function = self.code.partition(":")
        return getattr(importlib.import_module(module), function or "run")

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The stage module's hook `name` (one of HOOKS), None when it defines none."""
        assert name in HOOKS, name
        if callable(self.code):
            return None
        import importlib

        return getattr(importlib.import_module(self.code.partition(":")[0]), name, None)

    def settings(self, ctx: RunContext) -> dict[str, Any]:
        """`run`'s `settings=`: the stage's own run-config section; nothing for a stage without one."""
        return {"settings": getattr(ctx.cfg, self.section)} if self.section else {}

    def arg_names(self) -> list[str]:
        return [r if isinstance(r, str) else r.arg for r in self.reads]

    def runs(self, ctx: RunContext) -> bool:
        return self.name not in ctx.cfg.skip and self.when(ctx)

    def why_not(self, ctx: RunContext) -> str:
        return "skip lists it" if self.name in ctx.cfg.skip else self.unless


def evaluates(ctx: RunContext) -> bool:
    """Simulated logs are evaluated on their judged set, ingested ones on the given one or, without one,
    on the judge stage's grades from their clicks (not when clean keeps no impressions to grade)."""
    return not ctx.cfg.logs or bool(ctx.cfg.judgments.path) or ctx.cfg.judged_by_clicks()


PIPELINE: tuple[Stage, ...] = (
    Stage(
        "simulate",
        "stages.simulate.stage",
        "click logs simulated from the judged set's train queries (windowed runs: the run date's partition)",
        section="simulate",
        when=lambda ctx: not ctx.cfg.logs,
        unless="raw logs given (logs)",
    ),
    Stage(
        "clean",
        "stages.clean.stage",
        "raw logs parsed and validated: clicked pairs, title pool, impressions, rejects",
        section="clean",
        reads=("simulate",),
        retried=True,
    ),
    Stage(
        "propensity",
        "stages.propensity.stage",
        "the examination probability of each rank (position bias), by EM",
        section="propensity",
        reads=("clean",),
        retried=True,
    ),
    Stage(
        "judge",
        "stages.judge.stage",
        "a judged set graded from the logs' clicks: held-out test queries to evaluate on, the rest to tune on",
        section="judge",
        reads=("clean", "propensity"),
        when=lambda ctx: ctx.cfg.judged_by_clicks(),
        unless="a judged set given (judgments.path), simulated logs, or clean.impressions=false",
        retried=True,
        judges=True,
    ),
    Stage(
        "vocab",
        "stages.vocab.stage",
        "letter-trigram and word vocabularies",
        section="vocab",
        reads=("clean",),
        retried=True,
    ),
    Stage(
        "negatives",
        "stages.negatives.stage",
        "training rows: clicked pairs with sampled negatives, train/validation split by query",
        section="negatives",
        reads=("clean", "propensity"),
        retried=True,
        trains_on=True,
    ),
    Stage(
        "mine",
        "stages.mine.stage",
        "hard negatives from the last champion's index (BM25 on a first run) in place of some sampled ones",
        section="mine",
        reads=("negatives", "clean", Earlier("index")),
        when=lambda ctx: ctx.cfg.mine.hard > 0,
        unless="mine.hard=0",
        optional=True,
        trains_on=True,
    ),
    Stage(
        "teacher",
        "stages.teacher.stage",
        "lists of hard candidates per train query scored by a teacher (BM25, MiniLM, the last index), to distil",
        section="teacher",
        reads=(TrainingRows(), "clean", Earlier("index")),
        when=lambda ctx: bool(ctx.cfg.teacher.scorers),
        unless="teacher.scorers empty",
        optional=True,
        trains_on=True,
    ),
    Stage(
        "train",
        "stages.train.stage",
        "one model per encoder of train.models (torchrun with train.nproc processes)",
        section="train",
        reads=(TrainingRows(), "vocab"),
        each=lambda ctx: ctx.cfg.train.encoders(),
        trains_models=True,
    ),
    Stage(
        "evaluate",
        "stages.evaluate.stage",
        "NDCG against the baselines on the test queries, a MLflow run per system",
        section="evaluate",
        reads=("train", "negatives", "judge"),
        when=evaluates,
        unless="raw logs without judgments.path and clean.impressions=false: no judged set to evaluate on",
        warn_unless=True,
        retried=True,
    ),
    Stage(
        "register",
        "stages.register.stage",
        "each evaluated model logged as an MLflow model and registered as a version of dssm-DATASET",
        reads=("evaluate",),
        when=evaluates,
        unless="no evaluation",
        retried=True,
    ),
    Stage(
        "gate",
        "stages.gate.stage",
        "the champion alias moved to a registered version that beats the champion on the same eval set",
        section="gate",
        reads=("register",),
        when=evaluates,
        unless="no evaluation",
        retried=True,
    ),
    Stage(
        "index",
        "stages.index.stage",
        "the champion's ANN index over the catalogue, for dssm search",
        section="index",
        reads=("clean", "gate"),
        when=evaluates,
        unless="no evaluation",
        optional=True,
        retried=True,
        then='search the champion\'s index: dssm search --workdir {workdir} "cordless drill"',
    ),
    Stage(
        "analyze",
        "stages.analyze.stage",
        "what the trained LSTM-RNN reads (Palangi et al. section V-A)",
        section="analyze",
        reads=("train", "judge"),
        when=evaluates,
        unless="no evaluation",
        optional=True,
    ),
)


def check(pipeline: tuple[Stage, ...]) -> None:
    """Names are unique; a stage reads only stages before it, or what a stage with one output
    directory (not one per item) left earlier."""
    seen: list[str] = []
    names = {s.name: s for s in pipeline}
    for s in pipeline:
        if s.name in seen:
            raise ValueError(f"stage {s.name} is listed twice")
        for read in s.reads:
            if isinstance(read, Earlier) and read.stage not in names:
                raise ValueError(f"stage {s.name} reads Earlier({read.stage!r}), which is no stage")
            if isinstance(read, Earlier) and names[read.stage].each:
                raise ValueError(f"stage {s.name} reads Earlier({read.stage!r}), which has no one output directory")
            if isinstance(read, str) and read not in seen:
                raise ValueError(f"stage {s.name} reads {read!r}, which does not run before it")
            if isinstance(read, TrainingRows) and not any(names[n].trains_on for n in seen):
                raise ValueError(f"stage {s.name} reads the training rows, but no stage before it is trains_on")
        seen.append(s.name)


def optional_stages(pipeline: tuple[Stage, ...] = PIPELINE) -> list[str]:
    """The stages a run may name in `skip`."""
    return [s.name for s in pipeline if s.optional]


def planned(pipeline: tuple[Stage, ...], ctx: RunContext) -> int:
    """How many tasks a run of `pipeline` makes: the progress bar's total."""
    return sum(len(s.each(ctx)) if s.each else 1 for s in pipeline if s.runs(ctx))


def prepared(pipeline: tuple[Stage, ...], ctx: RunContext) -> RunContext:
    """The run after each stage that will run has had its `prepare` hook, in order."""
    for stage in pipeline:
        prepare = stage.hook("prepare") if stage.runs(ctx) else None
        if prepare is not None:
            ctx = prepare(ctx, **stage.settings(ctx))
    return ctx


def outputs_of(pipeline: tuple[Stage, ...], outputs: dict[str, Any]) -> list[tuple[Stage, StageOutput]]:
    """Each stage's outputs of a walk (one per item for `each` stages), in pipeline order."""
    found = []
    for stage in pipeline:
        out = outputs.get(stage.name)
        found += [(stage, o) for o in (out if isinstance(out, list) else [out]) if o is not None]
    return found


def walk(
    pipeline: tuple[Stage, ...],
    ctx: RunContext,
    done: Callable[[Stage, StageOutput | None], None],
    log: Any,
) -> dict[str, Any]:
    """Run `pipeline` in order, each stage (or item) as a Prefect task, inside the calling flow;
    returns every stage's output by name (a list for stages with `each`, None for those that did
    not run). `done` is told of each task's output as it finishes."""
    from prefect import task

    outputs: dict[str, Any] = {}
    for stage in pipeline:
        if not stage.runs(ctx):
            (log.warning if stage.warn_unless else log.info)("%s: not run (%s)", stage.name, stage.why_not(ctx))
            outputs[stage.name] = [] if stage.each else None
            continue
        reads = {name: _read(r, outputs, ctx, pipeline) for name, r in zip(stage.arg_names(), stage.reads, strict=True)}
        reads |= stage.settings(ctx)
        as_task = task(stage.run(), name=stage.name, **task_options(stage))
        if stage.each:
            outputs[stage.name] = []
            for item in stage.each(ctx):
                out = as_task.with_options(task_run_name=f"{stage.name}-{item}")(ctx, item, **reads)
                outputs[stage.name].append(out)
                done(stage, out)
        else:
            outputs[stage.name] = as_task(ctx, **reads)
            done(stage, outputs[stage.name])
    return outputs


def _read(read: str | TrainingRows | Earlier, outputs: dict[str, Any], ctx: RunContext, pipeline: tuple) -> Any:
    if isinstance(read, Earlier):
        return StageOutput.left_by_earlier_run(read.stage, ctx.layout.output(read.stage))
    if isinstance(read, TrainingRows):
        ran = [outputs[s.name] for s in pipeline if s.trains_on and outputs.get(s.name) is not None]
        return ran[-1] if ran else None
    return outputs[read]


def _worth_retrying(task, task_run, state) -> bool:
    """Retry what may pass (a Spark master or MLflow server not reachable yet), not bad data."""
    from core.errors import StageFailed

    try:
        state.result()
    except StageFailed as e:
        return e.transient
    except Exception:
        return True
    return False


def task_options(stage: Stage) -> dict[str, Any]:
    """Prefect's own result cache is off (the stages' manifests are the cache: Prefect's could not see
    an output deleted or replaced since); services' stages retry with backoff: 5 s, 10 s."""
    from prefect.cache_policies import NO_CACHE
    from prefect.tasks import exponential_backoff

    once = {"cache_policy": NO_CACHE, "persist_result": False}
    if not stage.retried:
        return once
    return once | {
        "retries": 2,
        "retry_delay_seconds": exponential_backoff(backoff_factor=5),
        "retry_condition_fn": _worth_retrying,
    }


def describe(pipeline: tuple[Stage, ...] = PIPELINE) -> str:
    """The stage list of `dssm run --help`."""
    lines = ["stages, in order (each a Prefect task; finished ones with unchanged inputs are skipped):"]
    for s in pipeline:
        reads = f" <- {', '.join(_shown(r) for r in s.reads)}" if s.reads else ""
        settings = f" (settings: {s.section}.*)" if s.section else ""
        off = [s.unless] if s.unless else []
        off += [f"skip=[{s.name}]"] if s.optional else []
        lines.append(f"  {s.name:<11}{s.doc}{settings}{reads}" + (f" [not run: {'; '.join(off)}]" if off else ""))
    return "\n".join(lines)


def _shown(read: str | TrainingRows | Earlier) -> str:
    return "rows (the last trains_on stage that ran)" if isinstance(read, TrainingRows) else getattr(read, "arg", read)


check(PIPELINE)
