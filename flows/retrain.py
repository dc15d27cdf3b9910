"""The `retrain` flow: simulate (or ingest) raw logs -> clean -> vocab -> negatives -> train -> evaluate
-> analyze.

Each stage is a Prefect task that gets paths and hands back a StageOutput (path + content hash),
never a DataFrame or a session. Stages cache by input hash in their manifests, so a rerun with
unchanged inputs skips finished stages, and a failed or killed run run again continues where it
stopped (training resumes from its last checkpoint). Prefect's own result cache is off: it could
not see that an output was deleted or replaced since.

Run it ad hoc with `dssm run`, on a schedule with `dssm schedule` (flows/schedule.py) or as a
work-pool deployment (prefect.yaml). See docs/flows.md.

Importing this module runs flows/__init__.py first, which sets Prefect defaults before prefect loads.
"""

# No `from __future__ import annotations`: Prefect validates the flow's `config: RunConfig` parameter
# with pydantic from the real annotation (a string would not resolve when a deployment loads the flow).
import json
import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from core.errors import StageFailed
from core.judgments import resolve_judged_set
from core.layout import Layout
from core.tracking import default_tracking_uri
from flows import stages
from flows.config import RunConfig


def _worth_retrying(task, task_run, state) -> bool:
    """Retry what may pass (a Spark master or MLflow server not reachable yet), not bad data."""
    try:
        state.result()
    except StageFailed as e:
        return e.transient
    except Exception:
        return True
    return False


_ONCE = {"cache_policy": NO_CACHE, "persist_result": False}
# The stages that talk to services (a Spark cluster, an MLflow server) retry with backoff: 5 s, 10 s.
_RETRIED = _ONCE | {
    "retries": 2,
    "retry_delay_seconds": exponential_backoff(backoff_factor=5),
    "retry_condition_fn": _worth_retrying,
}


# The stage functions themselves become tasks: one signature each, in flows/stages.py.
simulate_task = task(stages.simulate_stage, name="simulate", **_ONCE)
simulate_day_task = task(stages.simulate_day_stage, name="simulate", **_ONCE)
clean_task = task(stages.clean_stage, name="clean", **_RETRIED)
clean_window_task = task(stages.clean_window_stage, name="clean", **_RETRIED)
propensity_task = task(stages.propensity_stage, name="propensity", **_RETRIED)
vocab_task = task(stages.vocab_stage, name="vocab", **_RETRIED)
negatives_task = task(stages.negatives_stage, name="negatives", **_RETRIED)
train_task = task(stages.train_stage, name="train", **_ONCE)  # no retry: a rerun resumes from the checkpoint
evaluate_task = task(stages.evaluate_stage, name="evaluate", **_RETRIED)
index_task = task(stages.index_stage, name="index", **_RETRIED)
analyze_task = task(stages.analyze_stage, name="analyze", **_ONCE)


@flow(
    name="retrain",
    description="simulate or ingest click logs, clean, propensity, vocab, negatives, train, evaluate, gate, index, "
    "analyze",
)
def retrain(config: RunConfig = RunConfig()) -> dict[str, Any]:  # noqa: B008 (a typed default the UI shows)
    """The whole pipeline into `config.workdir`; returns the run summary also written to WORKDIR/report.json.

    `config` is one RunConfig (flows/config.py): a section per stage; in the Prefect UI every field
    of a deployment's config is editable. See docs/flows.md for the keys.
    """
    from tqdm import tqdm

    from evaluation.registry import CHAMPION, registered_name
    from jobs.catalogue import DEFAULT_CATALOGUE

    cfg = config
    logger = get_run_logger()
    layout = Layout(cfg.workdir)
    judged = resolve_judged_set(cfg.judgments.path, cfg.judgments.spec, DEFAULT_CATALOGUE)
    nproc = cfg.train.nproc or stages.default_nproc()
    mlflow_uri = cfg.mlflow_uri or default_tracking_uri(layout.workdir)  # one store for every stage
    master = cfg.spark_master or None
    overrides = [f"experiment={judged.name}", f"dataset={judged.name}", f"mlflow_uri={mlflow_uri}"]
    if cfg.train.epochs:
        overrides.append(f"epochs={cfg.train.epochs}")
    overrides += list(cfg.train.overrides)
    # model.encoder last: train.models wins over an encoder in train.overrides
    models = cfg.train.models
    per_model = {m: [*overrides, f"model.encoder={m}"] for m in models} if models else {"model": overrides}
    logs = cfg.logs or None
    evaluate = bool(cfg.judgments.path) or logs is None
    done: list[dict] = []

    indexed = evaluate and cfg.index_champion
    stage_count = 5 + len(per_model) + (logs is None) + evaluate + indexed + (evaluate and cfg.analyze)
    bar = tqdm(total=stage_count, desc="retrain", unit="stage", disable=None)

    def finished(out: stages.StageOutput) -> dict:
        out = out.to_dict()
        done.append(out)
        bar.update(1)
        state = "up to date, skipped" if out["skipped"] else f"done in {out['seconds']:.1f}s"
        logger.info("%s: %s -> %s (sha256 %s…)", out["stage"], state, out["path"], out["sha256"][:12])
        return out

    window = cfg.window()
    with stages.exclusive(layout.workdir), bar:
        if window:  # new logs land as a date partition each night; the last window_days are read
            if logs is None:
                finished(simulate_day_task(layout, judged, cfg.simulate, window[-1], cfg.force))
                logs = str(layout.logs)
            logger.info("window %s..%s of %s", window[0], window[-1], logs)
            cleaned = finished(clean_window_task(layout, logs, window, cfg.clean, master, cfg.force))
        else:
            if logs is None:
                logs = finished(simulate_task(layout, judged, cfg.simulate, cfg.force))["path"]
            cleaned = finished(clean_task(layout, logs, cfg.clean, master, cfg.force))
        bias = propensity_task(layout, cleaned["path"], cfg.propensity, master, cfg.force)
        if bias:
            bias = finished(bias)
        else:
            bar.update(1)
        vocab = finished(vocab_task(layout, cleaned["path"], cfg.vocab, master, cfg.force))
        curve = bias["path"] if bias and cfg.negatives.debias else None
        negatives = finished(negatives_task(layout, cleaned["path"], cfg.negatives, master, cfg.force, curve))
        logger.info("vocab %s and negatives %s ready", vocab["sha256"][:12], negatives["sha256"][:12])
        checkpoints = []
        for name, model_overrides in per_model.items():
            if window and cfg.train.warm_start:
                init_from, why = stages.warm_start_source(
                    layout,
                    mlflow_uri,
                    registered_name(judged.name),
                    model_overrides,
                    negatives["sha256"],
                    cfg.train.warm_min_overlap,
                )
                logger.info("train %s: %s", name, f"warm start from {why}" if init_from else f"from scratch: {why}")
                model_overrides = [*model_overrides, f"init_from={init_from}"] if init_from else model_overrides
            train_one = train_task.with_options(task_run_name=f"train-{name}")
            trained = train_one(layout, negatives["path"], model_overrides, nproc, cfg.force)
            checkpoints.append(finished(trained)["path"])
        report = None
        if evaluate:
            run_date = window[-1] if window else ""
            stage, report = evaluate_task(
                layout, checkpoints, judged, cfg.evaluate, negatives["path"], mlflow_uri, cfg.force, run_date
            )
            finished(stage)
            if indexed:
                champion = f"models:/{registered_name(judged.name)}@{CHAMPION}"
                titles = cfg.catalogue or cleaned["path"]
                finished(index_task(layout, titles, champion, cfg.index, mlflow_uri, master, cfg.force))
            if cfg.analyze:
                analysed = analyze_task(layout, checkpoints, judged, cfg.force)
                if analysed:
                    finished(analysed)
                else:
                    bar.update(1)
        else:
            logger.warning("raw logs given without judgments.path: nothing to evaluate on; evaluation skipped")
        log_config(cfg, mlflow_uri, judged.name, done)
        if bias:
            log_propensity(mlflow_uri, bias["path"], done)
        if window:
            log_window(mlflow_uri, window, cleaned["path"], done)
        return write_summary(layout, cfg, done, report)


def training_runs(done: list[dict]) -> list[str]:
    """The MLflow run ids of this flow run's training stages (made or reused)."""
    trained = [out["counts"].get("mlflow_run_id") for out in done if out["stage"] == "train"]
    return [run_id for run_id in trained if run_id]


def log_config(cfg: RunConfig, mlflow_uri: str, experiment: str, done: list[dict]) -> None:
    """The resolved run config as `run_config.json` of every MLflow training run this flow run made or reused."""
    import mlflow

    client = mlflow.MlflowClient(mlflow_uri)
    text = json.dumps(cfg.to_dict(), indent=2, default=str)
    for run_id in training_runs(done):
        client.log_text(run_id, text, "run_config.json")


def log_propensity(mlflow_uri: str, propensity_dir: str, done: list[dict]) -> None:
    """The position-bias curve the logs showed (examination per rank, relative to rank 1) as
    metrics `examination_rank_K` and the curve's JSON and plot, in every training run of this flow run."""
    import mlflow

    from jobs.propensity import CURVE_FILE, PLOT_FILE, read_curve

    client = mlflow.MlflowClient(mlflow_uri)
    curve = read_curve(Path(propensity_dir))
    for run_id in training_runs(done):
        for rank, value in zip(curve["ranks"], curve["examination"], strict=True):
            client.log_metric(run_id, f"examination_rank_{rank}", value)
        for name in (CURVE_FILE, PLOT_FILE):
            client.log_artifact(run_id, str(Path(propensity_dir) / name), "propensity")


def log_window(mlflow_uri: str, window: list[str], clean_dir: str, done: list[dict]) -> None:
    """A windowed run's dates and partition hashes as dataset inputs and tags of its training runs
    (evaluation tags the versions it registers with the run date). Logged on every run, skipped
    training included: MLflow keeps one input per dataset digest, so a run killed before this point
    is completed by its rerun."""
    import mlflow

    from core.tracking import log_datasets
    from jobs.window import window_inputs

    client = mlflow.MlflowClient(mlflow_uri)
    days = window_inputs(Path(clean_dir))
    for run_id in training_runs(done):
        log_datasets(mlflow_uri, run_id, [(name, path, sha, "training") for name, path, sha in days])
        client.set_tag(run_id, "window", f"{window[0]}..{window[-1]}")
        client.set_tag(run_id, "run_date", window[-1])


def write_summary(layout: Layout, cfg: RunConfig, done: list[dict], report: dict | None) -> dict[str, Any]:
    """WORKDIR/report.json: PROTOCOL.md §6's report, the resolved run config and the pipeline's stages,
    written atomically."""
    summary = dict(report or {})
    summary["config"] = cfg.to_dict()
    summary["pipeline"] = {"flow_run_id": flow_run.get_id(), "stages": done}
    path = layout.report
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}" if isinstance(value, float) else str(value)


def add_arguments(p) -> None:
    """`dssm run`'s options: the run config (flows/config.py)."""
    from flows.config import add_run_arguments

    add_run_arguments(p)


def command(args) -> None:
    """`dssm run`: the flow, ad hoc, then its table and each stage's time and counts."""
    import time

    from flows.config import config_from_args
    from flows.guardian import start_guardian

    cfg = config_from_args(args)
    start_guardian()  # a SIGKILL of this pid alone must not orphan the ephemeral Prefect server
    started = time.time()
    summary = retrain(cfg)
    layout = Layout(cfg.workdir)
    if (layout.evaluate / "report.md").exists() and "systems" in summary:
        print("\n" + (layout.evaluate / "report.md").read_text(), end="")
    print(f"\npipeline finished in {time.time() - started:.0f}s (flow run {summary['pipeline']['flow_run_id']}):")
    for out in summary["pipeline"]["stages"]:
        state = "skipped " if out["skipped"] else f"{out['seconds']:6.1f}s "
        shown = ", ".join(f"{k} {_number(v)}" for k, v in out["counts"].items())
        print(f"  {out['stage']:<10} {state} {out['path']}  ({shown})")
    for gate in summary.get("gate", []):
        decision = "promoted" if gate["promoted"] else "kept"
        print(f"  {gate['model']} v{gate['version']} ({gate['system']}): {decision} ({gate['reason']})")
    print(f"report: {layout.report}")
    if any(out["stage"] == "index" for out in summary["pipeline"]["stages"]):
        print(f'search the champion\'s index: dssm search --workdir {cfg.workdir} "cordless drill"')
