"""The `retrain` flow: the stages of flows/pipeline.py's PIPELINE, in order, each a Prefect task.

Each stage gets paths and hands back a StageOutput (path + content hash), never a DataFrame or a
session. Stages cache by input hash in their manifests, so a rerun with unchanged inputs skips
finished stages, and a failed or killed run run again continues where it stopped (training
resumes from its last checkpoint). Prefect's own result cache is off: it could not see that an
output was deleted or replaced since.

Run it ad hoc with `dssm run`, on a schedule with `dssm schedule` (flows/schedule.py) or as a
work-pool deployment (prefect.yaml). See docs/flows.md.

Importing this module runs flows/__init__.py first, which sets Prefect defaults before prefect loads.
"""

# No `from __future__ import annotations`: Prefect validates the flow's `config: RunConfig` parameter
# with pydantic from the real annotation (a string would not resolve when a deployment loads the flow).
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from core.judgments import resolve_judged_set
from core.layout import Layout
from core.locks import holding
from core.stage import RunContext, StageOutput
from core.stopping import at_deadline, begin, end_now, is_stop, signal_of
from core.tracking import client as mlflow_client
from core.tracking import default_tracking_uri, nested_under
from flows.config import RunConfig
from flows.guardian import ephemeral_api_gone
from flows.parent_run import close_parent, close_parent_on_the_way_out, drop_if_empty, open_parent
from flows.pipeline import PIPELINE, Stage, outputs_of, planned, prepared, walk


@contextmanager
def exclusive(work: Path) -> Iterator[None]:
    """Hold WORKDIR/.lock for one run: two runs in one work dir would train into the same checkpoint."""
    with holding(Layout(work).lock, str(work), "run"):
        yield


def context(cfg: RunConfig) -> RunContext:
    """The run, resolved once: judged set (hashed, named), one MLflow store, the window, the ranks, then what
    the stages that will run prepare (their `prepare` hooks)."""
    from core.judgments import DEFAULT_CATALOGUE, click_judged_set, clicks_dataset_name
    from modeling.distributed import default_nproc

    layout = Layout(cfg.workdir)
    if cfg.judged_by_clicks():  # graded from the logs' clicks by the stage that `judges`: hashed once written
        grader = next(stage for stage in PIPELINE if stage.judges)
        judged = click_judged_set(layout.output(grader.name), "", clicks_dataset_name(cfg.logs))
    else:
        judged = resolve_judged_set(cfg.judgments.path, cfg.judgments.spec, DEFAULT_CATALOGUE)
    ctx = RunContext(
        cfg=cfg,
        layout=layout,
        judged=judged,
        mlflow_uri=cfg.mlflow_uri or default_tracking_uri(layout.workdir),
        master=cfg.spark_master or None,
        window=cfg.window(),
        nproc=cfg.train.nproc or default_nproc(),
    )
    return prepared(PIPELINE, ctx)


@flow(name="retrain", description="simulate or ingest click logs, then every stage of flows/pipeline.py's PIPELINE")
def retrain(config: RunConfig = RunConfig()) -> dict[str, Any]:  # noqa: B008 (a typed default the UI shows)
    """The whole pipeline into `config.workdir`; returns the run summary also written to WORKDIR/report.json.

    `config` is one RunConfig (flows/config.py): a section per stage; in the Prefect UI every field
    of a deployment's config is editable. See docs/flows.md for the keys.
    """
    from tqdm import tqdm

    from flows.config import check_config, settled

    check_config(config)  # a deployment's parameter (the UI, prefect.yaml) skips `dssm run`'s loader: check it here
    config = settled(config)
    logger = get_run_logger()
    ctx = context(config)
    done: list[dict] = []
    bar = tqdm(total=planned(PIPELINE, ctx), desc="retrain", unit="stage", disable=None)

    with exclusive(ctx.layout.workdir), bar:
        parent, _ = open_parent(ctx.mlflow_uri, ctx.judged.name, ctx.layout.workdir, *flow_run_tags(ctx))
        # a stop whose unwinding outlasts the grace (a Spark call stuck on a JVM the same signal ended) still
        # leaves the parent KILLED, not RUNNING
        last_words = at_deadline(lambda: close_parent(ctx.mlflow_uri, parent, "KILLED"))

        def finished(stage: Stage, out: StageOutput | None) -> None:
            bar.update(1)
            if out is None:
                return
            done.append(out.to_dict())
            state = "up to date, skipped" if out.skipped else f"done in {out.seconds:.1f}s"
            logger.info("%s: %s -> %s (sha256 %s…)", out.stage, state, out.path, out.sha256[:12])
            if stage.trains_on:  # what the models train on (the last of them that ran)
                mlflow_client(ctx.mlflow_uri).set_tag(parent, "data_version", out.sha256)
            if stage.judges:  # the judged set graded from clicks, hashed now that it is written: one series per set
                from core.judgments import judged_set

                judged = judged_set(ctx.judged, out.path)
                mlflow_client(ctx.mlflow_uri).set_tag(parent, "dataset_sha256", judged.sha256)
                if judged.test_day:  # the time split's: the day it was graded from
                    mlflow_client(ctx.mlflow_uri).set_tag(parent, "test_day", judged.test_day)

        with last_words:  # through the except path too: the watchdog may fire while it unwinds
            try:
                with nested_under(parent):
                    outputs = walk(PIPELINE, ctx, finished, logger)
                run_ids = training_runs(outputs)
                log_config(config, ctx.mlflow_uri, run_ids)
                report: dict[str, Any] = {}
                for stage, out in outputs_of(PIPELINE, outputs):  # the stages' hooks after the walk
                    if log := stage.hook("log_to_training_runs"):
                        log(ctx, out, run_ids)
                    if add := stage.hook("report"):
                        report |= add(out)
                kept = drop_if_empty(ctx.mlflow_uri, parent)
                summary = write_summary(ctx.layout, config, done, report, parent if kept else None)
                if kept:
                    close_parent(ctx.mlflow_uri, parent, "FINISHED", ctx.layout.report)
                return summary
            except BaseException as e:
                stopped = is_stop(e)
                if stopped:  # Prefect's handler took the signal while the flow ran: the watchdog starts here
                    begin(signal_of(e))
                status = "KILLED" if stopped else "FAILED"
                close_parent_on_the_way_out(ctx.mlflow_uri, parent, status)
                if stopped and ephemeral_api_gone():  # nothing is left to record: the watchdog need not wait
                    end_now(signal_of(e), "Prefect's ephemeral API server ended with the same signal")
                raise


def flow_run_tags(ctx: RunContext) -> tuple[str, str, dict[str, str]]:
    """This flow run's id, its parent run's name (`flow-NAME`, windowed: `flow-RUN_DATE-NAME`) and tags."""
    name = flow_run.get_name() or "adhoc"
    day = f"{ctx.window[-1]}-" if ctx.window else ""
    tags = {"prefect.flow_run_name": name, "dataset": ctx.judged.name}
    if ctx.judged.sha256:  # a judged set graded from clicks is hashed when the judge stage writes it
        tags["dataset_sha256"] = ctx.judged.sha256
    if ctx.window:
        tags |= {"window": f"{ctx.window[0]}..{ctx.window[-1]}", "run_date": ctx.window[-1]}
    return flow_run.get_id() or "", f"flow-{day}{name}", tags


def training_runs(outputs: dict[str, Any]) -> list[str]:
    """The MLflow run ids of the models this flow run trained or reused (the stages marked `trains_models`)."""
    trained = [out.counts.get("mlflow_run_id") for stage, out in outputs_of(PIPELINE, outputs) if stage.trains_models]
    return [run_id for run_id in trained if run_id]


def log_config(cfg: RunConfig, mlflow_uri: str, run_ids: list[str]) -> None:
    """The resolved run config as `run_config.json` of every MLflow training run this flow run made or reused."""
    client = mlflow_client(mlflow_uri)
    text = json.dumps(cfg.to_dict(), indent=2, default=str)
    for run_id in run_ids:
        client.log_text(run_id, text, "run_config.json")


def write_summary(
    layout: Layout, cfg: RunConfig, done: list[dict], report: dict[str, Any], parent: str | None = None
) -> dict[str, Any]:
    """WORKDIR/report.json: PROTOCOL.md §6's report, the resolved run config and the pipeline's stages
    (with the flow run's id and its MLflow parent run's, None when no run was made), written atomically."""
    summary = dict(report)
    summary["config"] = cfg.to_dict()
    summary["pipeline"] = {"flow_run_id": flow_run.get_id(), "mlflow_parent_run_id": parent, "stages": done}
    path = layout.report
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary
