"""MLflow helpers shared by training and evaluation."""

from __future__ import annotations

import os
from pathlib import Path


def experiment_id(tracking_uri: str, name: str) -> str:
    """The id of experiment `name`, created if missing. With a local sqlite store, artifacts go
    beside the database (`mlartifacts/`), not into whatever directory the command ran from."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifacts = None
    if tracking_uri.startswith("sqlite:///"):
        artifacts = Path(tracking_uri[len("sqlite:///") :]).parent.joinpath("mlartifacts").as_uri()
    return mlflow.create_experiment(name, artifact_location=artifacts)


def default_tracking_uri(work: Path) -> str:
    """The default tracking URI: $MLFLOW_TRACKING_URI (e.g. the local stack's server), else a sqlite
    store in the work dir."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path(work) / 'mlflow.db').resolve()}"
