"""MLflow helpers shared by training and evaluation."""

from __future__ import annotations

import os
from pathlib import Path

from core.layout import Layout


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


# Read once, at import: mlflow.set_tracking_uri() writes MLFLOW_TRACKING_URI into os.environ, so
# a later read would see whichever store this process last used, not what the user set.
_USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")


def default_tracking_uri(work: Path) -> str:
    """The default tracking URI: $MLFLOW_TRACKING_URI as the command started with (e.g. the local
    stack's server), else a sqlite store in the work dir."""
    return _USER_TRACKING_URI or f"sqlite:///{Layout(work).mlflow_db.resolve()}"
