"""MLflow stores shared by concurrent runs (core/tracking.py)."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

import pytest

ROUNDS = 5


def _first_runs(stores: list[str], start, results) -> None:
    """One `dssm run`'s first touches of each store, as training's tracker makes them: the
    experiment (created if missing), then a run in it. Started together with a twin by `start`."""
    try:
        import mlflow  # imported before the barrier: the race is between store openings, not imports

        from core.tracking import client, experiment_id

        assert mlflow.MlflowClient
        for uri in stores:
            start.wait(timeout=120)
            exp = experiment_id(uri, "concurrent")
            run = client(uri).create_run(exp, run_name="first")
            client(uri).set_terminated(run.info.run_id)
            results.put(("ok", uri, run.info.run_id))
    except BaseException:
        results.put(("error", "", traceback.format_exc()))
        raise


@pytest.mark.integration
def test_two_processes_create_one_sqlite_store_at_once(tmp_path):
    """Two runs that open a new sqlite store at the same moment both finish (MLflow's first-use
    migrations used to run twice, and the second failed: alembic "Online migration expected to
    match one row"), in one experiment."""
    import mlflow

    stores = [f"sqlite:///{tmp_path / f'round{i}' / 'mlflow.db'}" for i in range(ROUNDS)]
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_first_runs, args=(stores, start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    answers = []
    try:
        while len(answers) < 2 * ROUNDS:
            status, uri, detail = results.get(timeout=300)
            assert status == "ok", detail  # the first failure ends the test: its twin waits at the barrier
            answers.append((uri, detail))
    finally:
        for p in procs:
            p.join(30 if len(answers) == 2 * ROUNDS else 0)
            if p.is_alive():
                p.terminate()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    for uri in stores:
        runs = [run_id for at, run_id in answers if at == uri]
        assert len(set(runs)) == 2
        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name("concurrent")
        found = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.run_id for r in found) == sorted(runs)
        assert all(r.info.status == "FINISHED" for r in found)
        assert Path(uri.removeprefix("sqlite:///") + ".lock").exists()


def test_experiments_open_on_their_runs_and_training_runs_are_named_by_encoder_and_seed(tiny_data, tmp_path):
    """MLflow 3's UI opens an experiment by its kind: dssm's hold model runs, not GenAI traces."""
    from conftest import tiny_model

    from core.tracking import EXPERIMENT_KIND, RUNS_KIND, client, experiment_id

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    made = experiment_id(uri, "fresh")
    assert client(uri).get_experiment(made).tags[EXPERIMENT_KIND] == RUNS_KIND
    older = client(uri).create_experiment("made-before-the-tag")  # an existing store's experiment
    assert experiment_id(uri, "made-before-the-tag") == older
    assert client(uri).get_experiment(older).tags[EXPERIMENT_KIND] == RUNS_KIND

    tiny_model(tiny_data, tmp_path / "model", "epochs=1", "seed=7")  # its run goes to tmp_path/train.db
    trained = f"sqlite:///{tmp_path}/train.db"
    runs = client(trained).search_runs([e.experiment_id for e in client(trained).search_experiments()])
    assert [r.info.run_name for r in runs] == ["lstm-seed7"]


def test_a_parent_run_the_stopped_process_cannot_close_is_closed_by_a_fresh_one(tmp_path, monkeypatch, caplog):
    """The fresh probe of issue 63 (medium): a SIGTERM while Spark started left the flow's parent run RUNNING
    ("could not mark parent run … KILLED: 'c'": the stop had cut this process's MLflow client half-way).
    The failure is made here by breaking close_parent in this process; a fresh process closes the run."""
    import logging

    import mlflow

    from core.tracking import client, experiment_id
    from flows import parent_run

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = client(uri).create_run(experiment_id(uri, "flow")).info.run_id

    def cut_half_way(*_):
        raise KeyError("c")

    monkeypatch.setattr(parent_run, "close_parent", cut_half_way)
    monkeypatch.setattr(parent_run, "CLOSE_WAIT_SECONDS", 120.0)  # a slow machine's imports: not what is tested
    caplog.set_level(logging.INFO, logger="dssm.flow")
    parent_run.close_parent_on_the_way_out(uri, parent, "KILLED")
    assert mlflow.MlflowClient(uri).get_run(parent).info.status == "KILLED"
    assert "marked KILLED by a fresh process (here: KeyError('c'))" in caplog.text


def test_a_night_opens_its_own_parent_run_and_leaves_an_earlier_nights_unfinished_one_as_it_was(tmp_path):
    """The fifth probe of issue 63 (medium): a night that failed left its parent FAILED; the next night
    continued it, so its runs were filed under the failed night's date and marked FINISHED. A rerun of the
    same night still continues its own unfinished parent."""
    from core.tracking import client
    from flows.parent_run import close_parent, open_parent

    uri, work = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "w"

    def night(day: str, flow_run_id: str) -> tuple[str, bool]:
        tags = {"window": f"2026-01-0{int(day[-1]) - 1}..{day}", "run_date": day}
        return open_parent(uri, "nights", work, flow_run_id, f"flow-{day}", tags)

    failed, new = night("2026-01-05", "fr-1")
    assert new
    close_parent(uri, failed, "FAILED")
    again, new = night("2026-01-05", "fr-2")  # the same night, rerun: its parent continued
    assert (again, new) == (failed, False)
    close_parent(uri, failed, "FAILED")
    assert night("2026-01-05", "fr-3") == (failed, False)  # ... and SIGKILLed: left RUNNING
    nxt, new = night("2026-01-06", "fr-4")
    assert new and nxt != failed
    earlier, this = client(uri).get_run(failed), client(uri).get_run(nxt)
    assert earlier.info.status == "KILLED" and earlier.data.tags["run_date"] == "2026-01-05"
    assert earlier.data.tags["prefect.flow_run_ids"] == "fr-1,fr-2,fr-3"
    assert this.info.status == "RUNNING" and this.data.tags["run_date"] == "2026-01-06"


def test_a_rerun_with_nothing_to_do_drops_the_empty_parent_it_continued(tmp_path):
    """The eighth probe of issue 63 (low): a flow run stopped before any stage made a run left its parent
    empty; the rerun found every stage up to date, continued that parent and kept it, empty, in report.json."""
    from core.tracking import client
    from flows.parent_run import close_parent, drop_if_empty, open_parent

    uri, work = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "w"
    stopped, new = open_parent(uri, "runs", work, "fr-1", "flow-1", {})
    assert new
    close_parent(uri, stopped, "KILLED")  # stopped in clean: nothing went under it
    again, new = open_parent(uri, "runs", work, "fr-2", "flow-2", {})
    assert (again, new) == (stopped, False)
    assert drop_if_empty(uri, again) is False
    assert client(uri).get_run(stopped).info.lifecycle_stage == "deleted"
    kept, _ = open_parent(uri, "runs", work, "fr-3", "flow-3", {})  # one with a run under it stays
    client(uri).create_run(client(uri).get_run(kept).info.experiment_id, tags={"mlflow.parentRunId": kept})
    assert drop_if_empty(uri, kept) is True


CREATE = "import sys; from core.tracking import open_store; open_store(sys.argv[1])"


def test_a_command_stopped_while_it_creates_a_store_leaves_none_that_later_commands_fail_on(tmp_path):
    """A store is created beside its path and renamed into place: a creator killed as soon as its database file
    has tables (mid-migration, where a stop used to leave "table scorers already exists" for every later
    command) leaves only a temp file, which the next opening removes; a store half made that way before this
    (tables, no finished migration, no run) is created again."""
    import shutil
    import signal
    import sqlite3
    import subprocess
    import sys
    import time
    from contextlib import closing

    import mlflow

    from core.tracking import open_store

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "mlflow.db"
    proc = subprocess.Popen([sys.executable, "-c", CREATE, f"sqlite:///{path}"], cwd=root)
    deadline, half = time.monotonic() + 120, None
    while time.monotonic() < deadline and proc.poll() is None and half is None:
        for made in tmp_path.glob("mlflow.db.creating-*"):
            if made.name.endswith("-journal"):
                continue
            try:
                with closing(sqlite3.connect(f"file:{made}?mode=ro", uri=True)) as db:
                    tables = db.execute("SELECT COUNT(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            except sqlite3.Error:
                continue
            if tables >= 5:  # mid-migration: some of MLflow's tables made, not all
                proc.send_signal(signal.SIGKILL)
                half = made
        time.sleep(0.002)
    proc.wait()
    assert half is not None and not path.exists()  # what was killed was the file beside it
    kept = tmp_path / "half.db"
    shutil.copy(half, kept)  # a half-made store, as one made in place before stores were made aside
    uri = f"sqlite:///{path}"
    open_store(uri)
    assert not list(tmp_path.glob("mlflow.db.creating-*"))  # the next opening removed the stopped one's file
    mlflow.MlflowClient(uri).create_experiment("after")
    repaired = f"sqlite:///{kept}"
    open_store(repaired)
    assert mlflow.MlflowClient(repaired).create_experiment("repaired")
