"""MLflow helpers shared by training and evaluation."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import DssmError
from core.layout import Layout

if TYPE_CHECKING:
    import mlflow

SQLITE = "sqlite:///"
_ready: set[str] = set()  # the sqlite stores this process has opened (their schema exists)
_ready_guard = threading.Lock()


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a local sqlite tracking URI, else None."""
    if not tracking_uri.startswith(SQLITE) or tracking_uri == SQLITE + ":memory:":
        return None
    return Path(tracking_uri[len(SQLITE) :])


@contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive lock on `S.db.lock` beside a sqlite store (nothing for other stores).

    MLflow creates a sqlite store's schema on first use by running its migrations; two processes
    that open a new store at once both see no tables, both migrate, and the second fails (alembic
    "Online migration expected to match one row"). A lock file beside the database serialises the
    first opening across processes (flock: released by the kernel when a holder dies)."""
    path = sqlite_path(tracking_uri)
    if path is None:
        yield
        return
    with exclusive(Path(f"{path}.lock")):
        yield


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """An exclusive flock on the file `lock` (created), released by the kernel when its holder dies."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def existing_store(tracking_uri: str, reader: str) -> None:
    """Refuse a local sqlite store that is not there: opening it would create an empty one in its place,
    and `reader` would then fail on a run or model it cannot find, naming neither."""
    path = sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise DssmError(
            f"{reader} reads the MLflow store that `dssm evaluate` logged to, {tracking_uri}, and it does not "
            "exist (moved or deleted?)"
        )


@contextmanager
def registry_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive lock on registering into one store from this machine: beside a sqlite store, else in the
    temp directory under the URI's hash (a server's registry shared between machines is not covered)."""
    import hashlib
    import tempfile

    path = sqlite_path(tracking_uri)
    name = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    lock = Path(f"{path}.register.lock") if path is not None else Path(tempfile.gettempdir()) / f"dssm-{name}.lock"
    with exclusive(lock):
        yield


def open_store(tracking_uri: str) -> None:
    """Make sure a sqlite store's schema (tracking and model registry tables, the default
    experiment) exists, creating it under `store_lock`; once per store and process."""
    if sqlite_path(tracking_uri) is None or tracking_uri in _ready:
        return
    import mlflow

    with _ready_guard, store_lock(tracking_uri):
        if tracking_uri in _ready:
            return
        path = sqlite_path(tracking_uri)
        for stale in path.parent.glob(f"{path.name}.creating-*"):  # a creation stopped part-way (we hold the lock)
            stale.unlink(missing_ok=True)
        if not path.exists() or _half_made(path):
            _create_store(path)
        _migrate(mlflow, tracking_uri)
        _ready.add(tracking_uri)


def _migrate(mlflow, tracking_uri: str) -> None:
    client = mlflow.MlflowClient(tracking_uri)
    client.search_experiments(max_results=1)  # the tracking store: its migrations, experiment 0
    client.search_registered_models(max_results=1)  # the registry store checks the same schema


def _create_store(path: Path) -> None:
    """A new sqlite store's schema made in a file beside it, then renamed into place: a command stopped while
    MLflow creates the tables (seconds of migrations) leaves a temp file, never a half-made store that every
    later command fails on ("table scorers already exists")."""
    import uuid

    import mlflow

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.creating-{uuid.uuid4().hex[:12]}")
    try:
        _migrate(mlflow, SQLITE + str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _half_made(path: Path) -> bool:
    """Whether `path` is a store whose creation was stopped part-way (before stores were created aside): its
    schema short of MLflow's latest migration and no run in it. One that holds runs is never replaced (an
    older MLflow's store: MLflow's own error says to upgrade it)."""
    import logging
    import sqlite3
    from contextlib import closing

    from mlflow.store.db.utils import _get_latest_schema_revision

    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            has = tables.__contains__
            version = db.execute("SELECT version_num FROM alembic_version").fetchall() if has("alembic_version") else []
            runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if has("runs") else 0
    except sqlite3.Error:  # not a database at all: MLflow names it
        return False
    if runs or version == [(_get_latest_schema_revision(),)]:
        return False
    if tables:
        logging.getLogger(__name__).warning("%s: half created by a command that was stopped; created again", path)
    return True


def client(tracking_uri: str) -> mlflow.MlflowClient:
    """An MlflowClient whose store is ready for use by concurrent processes (`open_store`)."""
    import mlflow

    open_store(tracking_uri)
    return mlflow.MlflowClient(tracking_uri)


def use_store(tracking_uri: str) -> None:
    """`mlflow.set_tracking_uri` for the fluent API, with the store opened first (`open_store`)."""
    import mlflow

    open_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)


# dssm's experiments hold model runs to compare, not GenAI traces. (MLflow 3.17's UI opens in its GenAI
# mode regardless until the browser switches to "Model training": docs/evaluation.md.)
EXPERIMENT_KIND, RUNS_KIND = "mlflow.experimentKind", "custom_model_development"


def experiment_id(tracking_uri: str, name: str) -> str:
    """The id of experiment `name`, created if missing, its kind set to model runs (the UI opens on
    them). With a local sqlite store, artifacts go beside the database (`mlartifacts/`), not into
    whatever directory the command ran from."""
    import mlflow
    from mlflow.exceptions import MlflowException

    use_store(tracking_uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.tags.get(EXPERIMENT_KIND) != RUNS_KIND:  # one made before the tag, or by hand
            mlflow.MlflowClient(tracking_uri).set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, RUNS_KIND)
        return experiment.experiment_id
    path = sqlite_path(tracking_uri)
    artifacts = path.resolve().parent.joinpath("mlartifacts").as_uri() if path is not None else None
    # A run of another process may create it between the look-up and here: the lock serialises
    # that on a sqlite store; a server's store answers RESOURCE_ALREADY_EXISTS instead.
    with store_lock(tracking_uri):
        experiment = mlflow.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return mlflow.create_experiment(name, artifact_location=artifacts, tags={EXPERIMENT_KIND: RUNS_KIND})
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return mlflow.get_experiment_by_name(name).experiment_id


# A flow run's parent MLflow run: each stage's runs are nested under it (tag `mlflow.parentRunId`).
# The training run is made in another process (torchrun's rank 0), so the id travels in the environment.
PARENT_RUN_ENV = "DSSM_MLFLOW_PARENT_RUN_ID"
PARENT_TAG = "mlflow.parentRunId"  # mlflow.utils.mlflow_tags.MLFLOW_PARENT_RUN_ID, what the UI nests by


def parent_run_id() -> str | None:
    """The parent run the runs made now go under (`nested_under`); None outside a flow run."""
    return os.environ.get(PARENT_RUN_ENV) or None


def parent_tags(parent: str | None) -> dict[str, str]:
    """The tags that nest a new run under `parent` (none without one)."""
    return {PARENT_TAG: parent} if parent else {}


@contextmanager
def nested_under(parent: str | None) -> Iterator[None]:
    """Runs made inside the block, in this process or in the processes it starts, go under `parent`."""
    before = os.environ.get(PARENT_RUN_ENV)
    if parent:
        os.environ[PARENT_RUN_ENV] = parent
    else:
        os.environ.pop(PARENT_RUN_ENV, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = before


# Read once, at import: mlflow.set_tracking_uri() writes MLFLOW_TRACKING_URI into os.environ, so
# a later read would see whichever store this process last used, not what the user set.
_USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")


def default_tracking_uri(work: Path) -> str:
    """The default tracking URI: $MLFLOW_TRACKING_URI as the command started with (e.g. the local
    stack's server), else a sqlite store in the work dir."""
    return absolute_store(_USER_TRACKING_URI or f"sqlite:///{Layout(work).mlflow_db.resolve()}")


def absolute_store(tracking_uri: str) -> str:
    """A sqlite tracking URI with its database path made absolute (`sqlite:///mlflow.db` is relative to the
    working directory): recorded in a manifest, it must name the same store for a step run from elsewhere."""
    path = sqlite_path(tracking_uri)
    return f"{SQLITE}{path.resolve()}" if path is not None and not path.is_absolute() else tracking_uri


def log_datasets(tracking_uri: str, run_id: str, datasets: list[tuple[str, str, str, str]]) -> None:
    """Record datasets as MLflow dataset inputs of a run, so runs filter and compare by data version.

    Each entry is (name, path, content sha256, context: training, validation, evaluation, catalogue).
    The digest is the hash's first 32 hex digits (MLflow stores at most 36); the full hash is a tag."""
    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    inputs = []
    for name, path, sha256, context in datasets:
        dataset = MetaDataset(local(str(path)), name=name, digest=sha256[:32])._to_mlflow_entity()
        tags = [InputTag("mlflow.data.context", context), InputTag("sha256", sha256)]
        inputs.append(DatasetInput(dataset, tags))
    client(tracking_uri).log_inputs(run_id, datasets=inputs)


@dataclass(frozen=True)
class ModelRef:
    """A registered model version (or a run's model) and where its files come from."""

    uri: str
    name: str
    version: str
    run_id: str

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}" if self.name else self.uri


def resolve_model(uri: str, tracking_uri: str) -> ModelRef:
    """models:/NAME@ALIAS or models:/NAME/VERSION as the version it names now; runs:/ URIs as they are."""
    from mlflow.exceptions import MlflowException

    from core.tracking import client as mlflow_client
    from core.tracking import use_store

    use_store(tracking_uri)
    if not uri.startswith("models:/"):
        return ModelRef(uri, "", "", uri.split("/")[1] if uri.startswith("runs:/") else "")
    client = mlflow_client(tracking_uri)
    rest = uri[len("models:/") :]
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, version = rest.split("/", 1)
            mv = client.get_model_version(name, version)
    except (MlflowException, ValueError) as e:
        raise DssmError(f"--model {uri}: no such registered model version in {tracking_uri} ({e})") from None
    return ModelRef(f"models:/{mv.name}/{mv.version}", mv.name, str(mv.version), mv.run_id)
