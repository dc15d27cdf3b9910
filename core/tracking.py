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


def log_datasets(tracking_uri: str, run_id: str, datasets: list[tuple[str, str, str, str]]) -> None:
    """Record datasets as MLflow dataset inputs of a run, so runs filter and compare by data version.

    Each entry is (name, path, content sha256, context: training, validation, evaluation, catalogue).
    The digest is the hash's first 32 hex digits (MLflow stores at most 36); the full hash is a tag."""
    import mlflow
    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    inputs = []
    for name, path, sha256, context in datasets:
        dataset = MetaDataset(local(str(path)), name=name, digest=sha256[:32])._to_mlflow_entity()
        tags = [InputTag("mlflow.data.context", context), InputTag("sha256", sha256)]
        inputs.append(DatasetInput(dataset, tags))
    mlflow.MlflowClient(tracking_uri).log_inputs(run_id, datasets=inputs)
