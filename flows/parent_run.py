"""One MLflow parent run per flow run, with every run the flow's stages make nested under it.

A flow run opens its parent before the first stage and puts its id in the environment for the
stages (core.tracking.nested_under): evaluation nests the runs it makes; training's rank 0, in a
torchrun process, reads it from there. A killed or failed flow run leaves its parent unfinished;
the next flow run on the same work dir continues that parent instead of opening a second one, as
its stages continue the work (training resumes its checkpoint's run, finished stages are skipped).
A flow run that made no run at all (every stage up to date) leaves no parent behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from core.tracking import PARENT_TAG, experiment_id
from core.tracking import client as mlflow_client

if TYPE_CHECKING:
    import mlflow

log = logging.getLogger("dssm.flow")

KIND = "flow"  # the parent's `kind` tag (evaluation runs: baseline, trained, hybrid)
FLOW_RUN_TAG = "prefect.flow_run_id"  # the flow run that last worked in the parent
FLOW_RUNS_TAG = "prefect.flow_run_ids"  # every flow run that did, comma-separated, oldest first
UNFINISHED = ("RUNNING", "FAILED", "KILLED")


def _quoted(value: str) -> str:
    return f'"{value}"' if "'" in value else f"'{value}'"


def last_parent(client: mlflow.MlflowClient, experiment: str, workdir: Path):
    """The newest parent run of a flow run on `workdir` in `experiment`, or None."""
    where = f"tags.kind = '{KIND}' and tags.workdir = {_quoted(str(workdir))}"
    runs = client.search_runs([experiment], where, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def children(client: mlflow.MlflowClient, experiment: str, parent: str) -> list:
    """The runs nested under `parent`."""
    return client.search_runs([experiment], f"tags.`{PARENT_TAG}` = '{parent}'", max_results=10_000)


def open_parent(
    uri: str, experiment_name: str, workdir: Path, flow_run_id: str, name: str, tags: dict[str, str]
) -> tuple[str, bool]:
    """The parent run of this flow run and whether it is new: the work dir's last parent when a killed
    or failed flow run of the same window (the same night, or both unwindowed) left it unfinished (its
    runs still running were cut off: marked KILLED; a training run resumed from its checkpoint runs
    again), else a new run named `name`; another night's unfinished parent keeps its own night's runs
    and is left KILLED or FAILED. Called under the work dir's lock: no other flow run uses that parent."""
    client = mlflow_client(uri)
    experiment = experiment_id(uri, experiment_name)
    workdir = workdir.resolve()
    last = last_parent(client, experiment, workdir)
    if last is not None and last.info.status in UNFINISHED:
        parent = last.info.run_id
        for run in children(client, experiment, parent):
            if run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, "KILLED")
        if last.data.tags.get("window") != tags.get("window"):
            if last.info.status == "RUNNING":  # a night SIGKILLed: nothing closed it
                client.set_terminated(parent, "KILLED")
            log.info("MLflow: the unfinished parent run %s is another night's (%s): left as it is",
                     parent, last.data.tags.get("window", "no window"))  # fmt: skip
            return _new_parent(client, experiment, workdir, flow_run_id, name, tags), True
        client.update_run(parent, status="RUNNING")
        earlier = last.data.tags.get(FLOW_RUNS_TAG, "")
        if flow_run_id not in earlier.split(","):
            client.set_tag(parent, FLOW_RUNS_TAG, f"{earlier},{flow_run_id}".strip(","))
        client.set_tag(parent, FLOW_RUN_TAG, flow_run_id)
        log.info("MLflow: continuing the parent run %s of an unfinished flow run on %s", parent, workdir)
        return parent, False
    return _new_parent(client, experiment, workdir, flow_run_id, name, tags), True


def _new_parent(client, experiment: str, workdir: Path, flow_run_id: str, name: str, tags: dict[str, str]) -> str:
    own = {"kind": KIND, "workdir": str(workdir), FLOW_RUN_TAG: flow_run_id, FLOW_RUNS_TAG: flow_run_id}
    return client.create_run(experiment, run_name=name, tags=tags | own).info.run_id


def drop_if_empty(uri: str, parent: str) -> bool:
    """Delete a parent that nothing went under (every stage was up to date, so this flow run made no run,
    nor did the stopped one whose parent it continued); returns whether the parent is kept."""
    client = mlflow_client(uri)
    if not children(client, client.get_run(parent).info.experiment_id, parent):
        client.delete_run(parent)
        log.info("MLflow: every stage was up to date and no run was made; no parent run kept")
        return False
    return True


def close_parent(uri: str, parent: str, status: str, report: Path | None = None) -> None:
    """End the parent with `status` (FINISHED, FAILED, KILLED), the flow run's report.json attached."""
    client = mlflow_client(uri)
    if report is not None and report.is_file():
        client.log_artifact(parent, str(report))
    client.set_terminated(parent, status)


def close_parent_on_the_way_out(uri: str, parent: str, status: str) -> None:
    """`close_parent` for a flow run that failed or was stopped; when that fails in this process (a stop
    can cut an import or a store connection half-way), once more in a fresh one, so that the parent does
    not stay RUNNING until the next run on the work dir. The fresh process has a session of its own: if
    it outlasts CLOSE_WAIT_SECONDS (within a stop's grace) it goes on after this process has ended. Never
    raises: the flow's own error is the one to report."""
    import subprocess
    import sys

    try:
        close_parent(uri, parent, status)
        return
    except Exception as e:
        first = e
    script = "import sys; from flows.parent_run import close_parent; close_parent(*sys.argv[1:])"
    try:
        child = subprocess.Popen([sys.executable, "-c", script, uri, parent, status], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        code = child.wait(timeout=CLOSE_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        log.warning("MLflow: parent run %s is being marked %s by a fresh process (pid %d; here: %r)", parent, status,
                    child.pid, first)  # fmt: skip
        return
    except OSError as e:
        code = f"{e}"
    if code == 0:
        log.info("MLflow: parent run %s marked %s by a fresh process (here: %r)", parent, status, first)
    else:
        log.warning("MLflow: could not mark parent run %s %s: %r; nor a fresh process (exit %s)", parent, status,
                    first, code)  # fmt: skip


CLOSE_WAIT_SECONDS = 6.0  # of core.stopping's 10 s grace after a stop
