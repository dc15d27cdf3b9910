"""MLflow for a training run: rank 0 logs, every other rank holds a no-op tracker. Inside a flow run
the run is nested under the flow's parent run (core.tracking.PARENT_RUN_ENV)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.tracking import PARENT_TAG, experiment_id, log_datasets, parent_run_id, parent_tags

if TYPE_CHECKING:
    from modeling.config import TrainJob


OFF = "none"  # mlflow_uri=none: a run logged nowhere (a throughput check on a machine without MLflow)


class Tracker:
    """MLflow on rank 0; one run per training run (resumed runs continue it). No-op elsewhere, and
    everywhere with mlflow_uri=none."""

    def __init__(self, cfg: TrainJob, enabled: bool, run_id: str | None, tags: dict[str, str], datasets: list[tuple]):
        self.enabled = enabled and cfg.mlflow_uri != OFF
        self.run_id = run_id
        if not self.enabled:
            return
        import mlflow

        self.mlflow = mlflow
        name = cfg.run_name or f"{cfg.model.encoder}-seed{cfg.seed}"  # runs compared side by side say what they are
        experiment = experiment_id(cfg.mlflow_uri, cfg.experiment)
        parent = parent_run_id()
        new = parent_tags(parent) if run_id is None else None
        run = mlflow.start_run(run_id=run_id, experiment_id=experiment, run_name=name, tags=new)
        self.run_id = run.info.run_id
        if run_id is None:
            mlflow.log_params({k: str(v)[:500] for k, v in cfg.flat().items()})
            mlflow.set_tags(tags)
            log_datasets(cfg.mlflow_uri, self.run_id, datasets)
        elif parent and PARENT_TAG not in run.data.tags:  # a run begun outside a flow, resumed by one
            mlflow.set_tag(PARENT_TAG, parent)

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.enabled:
            self.mlflow.log_metrics(values, step=step)

    def close(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.mlflow.end_run(status)
