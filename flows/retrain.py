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

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from dssm.errors import StageFailed
from dssm.judgments import JudgedSetSpec
from dssm.tracking import default_tracking_uri
from flows import stages
from jobs.simulate import SimulationConfig


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


@task(name="simulate", **_ONCE)
def simulate_task(work: Path, judgments: str | None, spec: JudgedSetSpec, settings: dict, force: bool) -> dict:
    return stages.simulate_stage(work / "simulate", judgments, spec, settings, force).to_dict()


@task(name="clean", **_RETRIED)
def clean_task(work: Path, logs: str, master: str | None, force: bool) -> dict:
    return stages.clean_stage(work, logs, master, force).to_dict()


@task(name="vocab", **_RETRIED)
def vocab_task(work: Path, clean_dir: str, master: str | None, force: bool) -> dict:
    return stages.vocab_stage(work, clean_dir, master, force).to_dict()


@task(name="negatives", **_RETRIED)
def negatives_task(work: Path, clean_dir: str, n: int, master: str | None, force: bool) -> dict:
    return stages.negatives_stage(work, clean_dir, n, master, force).to_dict()


@task(name="train", **_ONCE)  # no retry: a rerun of the flow resumes from the checkpoint instead
def train_task(work: Path, negatives_dir: str, overrides: list[str], nproc: int, force: bool) -> dict:
    return stages.train_stage(work, negatives_dir, overrides, nproc, force).to_dict()


@task(name="evaluate", **_RETRIED)
def evaluate_task(
    work: Path,
    checkpoints: list[str],
    judgments: str | None,
    spec: JudgedSetSpec,
    baselines: list[str],
    mlflow_uri: str | None,
    force: bool,
) -> dict:
    out, report = stages.evaluate_stage(work, checkpoints, judgments, spec, baselines, mlflow_uri, force)
    return {"stage": out.to_dict(), "report": report}


@task(name="analyze", **_ONCE)
def analyze_task(work: Path, checkpoints: list[str], judgments: str | None, spec: JudgedSetSpec, force: bool) -> dict:
    out = stages.analyze_stage(work, checkpoints, judgments, spec, force)
    return out.to_dict() if out else {}


@flow(
    name="retrain", description="simulate or ingest click logs, clean, vocab, negatives, train, evaluate, gate, analyze"
)
def retrain(
    workdir: str = "work",
    judgments: str | None = None,
    query_col: str = "search_term",
    title_col: str = "product_title",
    label_col: str = "relevance",
    encoding: str = "latin-1",
    logs: str | None = None,
    impressions: int = SimulationConfig.impressions,
    seed: int = SimulationConfig.seed,
    shards: int = 0,
    workers: int = 0,
    negatives_per_pair: int = 4,
    models: list[str] | None = None,
    epochs: int | None = None,
    train_overrides: list[str] | None = None,
    nproc: int = 0,
    baselines: list[str] | None = None,
    mlflow_uri: str | None = None,
    spark_master: str | None = None,
    analyze: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """The whole pipeline into `workdir`; returns the run summary also written to WORKDIR/report.json.

    judgments: the judged set to simulate logs from and to evaluate on (default: the embedded
    catalogue); logs: raw logs to ingest instead of simulating (evaluation then needs `judgments`);
    models: encoders to train and evaluate side by side (default: the config's, lstm); epochs:
    training epochs (default: the config's); train_overrides: training config KEY=VALUE overrides;
    nproc: training processes (0: one per GPU, else 1); baselines: evaluated beside the models
    (default bm25); mlflow_uri: default $MLFLOW_TRACKING_URI, else the sqlite store
    WORKDIR/mlflow.db; spark_master: default $DSSM_SPARK_MASTER, else local[*]; analyze: after the
    evaluation, `dssm analyze` the trained recurrent model into WORKDIR/analysis and its MLflow run.
    """
    from tqdm import tqdm

    logger = get_run_logger()
    work = Path(workdir)
    spec = JudgedSetSpec(query_col, title_col, label_col, encoding)
    dataset = stages.dataset_of(judgments)
    nproc = nproc or stages.default_nproc()
    mlflow_uri = mlflow_uri or default_tracking_uri(work)  # one store for every stage
    overrides = [f"experiment={dataset}", f"dataset={dataset}", f"mlflow_uri={mlflow_uri}"]
    if epochs is not None:
        overrides.append(f"epochs={epochs}")
    overrides += list(train_overrides or [])
    # model.encoder last: --models wins over an encoder in --train
    per_model = {m: [*overrides, f"model.encoder={m}"] for m in models} if models else {"model": overrides}
    evaluate = judgments is not None or logs is None
    done: list[dict] = []

    stage_count = 4 + len(per_model) + (logs is None) + evaluate + (evaluate and analyze)
    bar = tqdm(total=stage_count, desc="retrain", unit="stage", disable=None)

    def finished(out: dict) -> dict:
        done.append(out)
        bar.update(1)
        state = "up to date, skipped" if out["skipped"] else f"done in {out['seconds']:.1f}s"
        logger.info("%s: %s -> %s (sha256 %s…)", out["stage"], state, out["path"], out["sha256"][:12])
        return out

    with stages.exclusive(work), bar:
        if logs is None:
            settings = {"impressions": impressions, "seed": seed, "shards": shards, "workers": workers}
            logs = finished(simulate_task(work, judgments, spec, settings, force))["path"]
        cleaned = finished(clean_task(work, logs, spark_master, force))
        vocab = finished(vocab_task(work, cleaned["path"], spark_master, force))
        negatives = finished(negatives_task(work, cleaned["path"], negatives_per_pair, spark_master, force))
        logger.info("vocab %s and negatives %s ready", vocab["sha256"][:12], negatives["sha256"][:12])
        checkpoints = []
        for name, model_overrides in per_model.items():
            train_one = train_task.with_options(task_run_name=f"train-{name}")
            checkpoints.append(finished(train_one(work, negatives["path"], model_overrides, nproc, force))["path"])
        report = None
        if evaluate:
            evaluated = evaluate_task(work, checkpoints, judgments, spec, baselines or ["bm25"], mlflow_uri, force)
            finished(evaluated["stage"])
            report = evaluated["report"]
            if analyze:
                analysed = analyze_task(work, checkpoints, judgments, spec, force)
                if analysed:
                    finished(analysed)
                else:
                    bar.update(1)
        else:
            logger.warning("raw logs given without --judgments: nothing to evaluate on; evaluation skipped")
        return write_summary(work, done, report)


def write_summary(work: Path, done: list[dict], report: dict | None) -> dict[str, Any]:
    """WORKDIR/report.json: PROTOCOL.md §6's report plus the pipeline's stages, written atomically."""
    summary = dict(report or {})
    summary["pipeline"] = {"flow_run_id": flow_run.get_id(), "stages": done}
    path = work / "report.json"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary
