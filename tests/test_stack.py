"""The local stack as real processes (Prefect server, MLflow server, Spark standalone master and
worker) keeping their state in the machine's PostgreSQL (`--database`; skipped where none answers),
and scheduled retraining on it: `dssm schedule` registers a cron deployment, the Prefect server
schedules a run, the runner executes the flow against the stack's Spark and MLflow. The flow
ingests a v2 log (doc ids and a catalogue side table), so the clean job's output on the standalone
cluster can be compared row for row with a local[2] clean: the same job code, only the master
differs. Then two `dssm run` at once against the same servers and registered model: the champion
alias ends on the best version. The servers grant no foreign origin or host."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from conftest import free_port

from core.artifacts import read_manifest
from core.judgments import DEFAULT_CATALOGUE
from core.spark import NO_EXECUTOR_TIMEOUT_ENV
from infra import database, stack

pytestmark = pytest.mark.integration


def post(url: str, body: dict) -> list | dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def post_when_up(url: str, body: dict) -> list | dict | None:
    """`post`, or None while the server answers 503: busy starting up (on one core, for a minute)."""
    try:
        return post(url, body)
    except urllib.error.HTTPError as e:
        if e.code != 503:
            raise
        return None


def wait_until(what: str, check, timeout: float, proc: subprocess.Popen, log) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s; dssm schedule said:\n{log.read_text()[-3000:]}")
        time.sleep(2)


def stop(serve: subprocess.Popen) -> None:
    """Stop `dssm schedule` as Ctrl-C does (its runner pauses the schedule), killing it after 60s."""
    os.killpg(serve.pid, signal.SIGINT)
    try:
        serve.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()


# The services are what this tests: one hybrid (the model with BM25) and the re-ranking gate, not the default 3-way
# fusion with the bundled MiniLM, whose cost (loading it in every run and Spark worker) tests/test_flows.py pays once
ONE_HYBRID = ["evaluate.fusions=[MODEL+bm25]", "gate.metric=ndcg@10"]


def assert_same_rows(cleaned: Path, reference: Path) -> None:
    """Two clean outputs hold the same rows in the same order (compressed bytes may differ between JVM set-ups)."""
    for dataset in ("pairs", "titles", "rejects"):
        assert pq.read_table(cleaned / dataset).equals(pq.read_table(reference / dataset)), dataset


def champion_is_the_best(client, name: str) -> tuple[str, float]:
    """The `champion` of registered model `name` is the version with the best gate metric among all
    measured on its eval set, and its evaluation run logged that metric: (version, metric)."""
    champion = client.get_model_version_by_alias(name, "champion")
    key = next(k for k in champion.tags if k.startswith("ndcg_at_10."))
    measured = {v.version: float(v.tags[key]) for v in client.search_model_versions(f"name='{name}'") if key in v.tags}
    assert measured[champion.version] == max(measured.values()), (champion.version, measured)
    logged = client.get_run(champion.run_id).data.metrics["ndcg_at_10"]
    assert abs(logged - measured[champion.version]) < 1e-4  # the gate gets the report's value, to 4 decimals
    return champion.version, measured[champion.version]


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory) -> Iterator[dict]:
    """`dssm stack up` with its state in a fresh PostgreSQL database (skipped where none answers): the
    config, what up returned, the environment a command run against it gets, and a scratch dir. The tests
    below use it in turn; the last takes it down. Whatever is still up at the end is taken down."""
    from conftest import postgres_database

    root = tmp_path_factory.mktemp("pg-stack")
    with postgres_database() as url:
        cfg = stack.StackConfig(
            root=root / "stack",
            prefect_port=free_port(),
            mlflow_port=free_port(),
            spark_port=free_port(),
            spark_ui_port=free_port(),
            spark_worker_ui_port=free_port(),
            database=url,
        )
        state = stack.up(cfg, progress=lambda _: None)
        env = {**os.environ, **stack.environment(state["urls"]), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        # a loaded 2-core machine may take minutes to start the scheduled run's executors
        env[NO_EXECUTOR_TIMEOUT_ENV] = "600"
        try:
            yield {"cfg": cfg, "state": state, "env": env, "url": url, "tmp": root}
        finally:
            if stack.status(cfg.root):
                stack.down(cfg.root, progress=lambda _: None)


def test_the_stack_keeps_its_state_in_postgresql_and_no_password_in_a_command_line(pg_stack, capsys):
    cfg, state, postgres_url = pg_stack["cfg"], pg_stack["state"], pg_stack["url"]
    assert stack.status(cfg.root) == {n: True for n in ["mlflow", "prefect", "spark-master", "spark-worker"]}
    # both servers keep their state in their own database on the PostgreSQL server, none in sqlite
    assert state["database"] == stack.database_record(cfg) and state["database"]["kind"] == "postgresql"
    assert not list((cfg.root / "mlflow").glob("*.db")) and not list((cfg.root / "prefect").glob("*.db"))
    # no store URL (a password) in any command line of the stack: `ps` shows those to every local user
    stores = database.service_urls(postgres_url).values()
    for service in state["services"].values():
        for proc in [psutil.Process(service["pid"]), *psutil.Process(service["pid"]).children(recursive=True)]:
            try:
                shown = " ".join(proc.cmdline())
            except psutil.Error:  # a child that ended (or a zombie) meanwhile shows nothing
                continue
            assert not [url for url in stores if url in shown], proc.cmdline()[:3]
    from dssm.cli import main

    capsys.readouterr()
    assert main(["stack", "status", "--dir", str(cfg.root)]) == 0
    assert main(["stack", "env", "--dir", str(cfg.root)]) == 0
    said = capsys.readouterr().out
    names = stack.database_record(cfg)
    assert f"PostgreSQL {postgres_url}: MLflow in database {names['mlflow']}, Prefect in {names['prefect']}" in said
    assert "database      answers" in said and "# database: PostgreSQL" in said
    assert_no_other_origin_or_host(cfg)  # the servers as `dssm stack up` starts them


@pytest.fixture(scope="module")
def scheduled(pg_stack, spark, default_pairs) -> dict:
    """`dssm schedule` of a cron deployment on the stack, until the Prefect server has scheduled a run and it
    completed. Its logs are v2 (doc ids, titles in the catalogue side table, the vectorised parser on the
    executors), which the run cleans on the cluster; meanwhile (the schedule waits for its minute, up to
    60 s) this process cleans them locally, to compare."""
    from stages.clean.job import clean
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate

    state, env, tmp = pg_stack["state"], pg_stack["env"], pg_stack["tmp"]
    work, log, logs = tmp / "w", tmp / "schedule.log", tmp / "logs-v2"
    simulate(default_pairs, logs, SimulationConfig(impressions=5_000, shards=2, workers=1, log_format=2),
             {"path": "default", "sha256": "default"})  # fmt: skip
    cmd = [sys.executable, "-m", "dssm.cli", "schedule", "--cron", "* * * * *", "--name", "ci-nightly"]
    cmd += ["--workdir", str(work), "--logs", str(logs), "--judgments", str(DEFAULT_CATALOGUE)]
    cmd += [*ONE_HYBRID, "--train", "data.batch_size=64", "epochs=2", "model.ncell=16", "--no-analyze"]
    serve = None
    try:
        with open(log, "w") as out:
            serve = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        api = state["urls"]["prefect"]

        def deployment():
            found = [d for d in post(f"{api}/deployments/filter", {}) if d["name"] == "ci-nightly"]
            return found[0] if found else None

        registered = wait_until("deployment registered", deployment, 120, serve, log)
        local = clean(spark, str(logs), tmp / "clean-local")

        def finished_run():
            runs = post(f"{api}/flow_runs/filter", {"deployments": {"id": {"any_": [registered["id"]]}}})
            failed = [r for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
            assert not failed, f"scheduled run {failed[0]['state_type']}: {failed[0]['state']['message']}"
            return next((r for r in runs if r["state_type"] == "COMPLETED"), None)

        # a few minutes alone; 420s was overrun on 2 cores at load 11-16 (other jobs), before and after --database
        run = wait_until("a scheduled run completed", finished_run, 900, serve, log)
        stop(serve)  # Ctrl-C: the schedule pauses; no second scheduled run starts beside what follows
        serve = None
    finally:
        if serve is not None:
            stop(serve)
    return {"work": work, "run": run, "registered": registered, "api": api, "logs": logs,
            "local": (tmp / "clean-local", local["counts"])}  # fmt: skip


def test_a_v2_log_cleans_on_the_cluster_to_the_rows_it_cleans_to_locally(scheduled):
    """The scheduled run's clean stage, on the stack's Spark (the next test checks where it ran), against
    this process's local[2] clean of the same v2 log: the same counts and rows, in the same order
    (compressed bytes may differ between JVM set-ups; a rerun on one set-up is byte-identical)."""
    local, counts = scheduled["local"]
    assert read_manifest(scheduled["work"] / "clean")["counts"] == counts
    assert_same_rows(scheduled["work"] / "clean", local)


def test_the_scheduled_run_ran_on_the_stacks_spark_and_logged_to_its_mlflow(pg_stack, scheduled):
    state, cfg = pg_stack["state"], pg_stack["cfg"]
    work, run, registered = scheduled["work"], scheduled["run"], scheduled["registered"]
    assert [s["schedule"]["cron"] for s in registered["schedules"] if s["active"]] == ["* * * * *"]
    assert registered["parameters"]["config"]["workdir"] == str(work)  # one parameter, the run config
    assert run["auto_scheduled"] and run["parameters"]["config"]["workdir"] == str(work)
    report = json.loads((work / "report.json").read_text())
    assert report["pipeline"]["flow_run_id"] == run["id"] and set(report["systems"]) == {"bm25", "lstm", "lstm+bm25"}
    assert [s["stage"] for s in report["pipeline"]["stages"]] == [
        "clean",
        "propensity",
        "vocab",
        "negatives",
        "train",
        "evaluate",
        "register",
        "gate",
        "index",
    ]
    # the data stages and the index's embedding UDF ran on the stack's Spark master (the rows: the test above) ...
    with urllib.request.urlopen(f"{state['urls']['spark_ui']}/json/") as response:
        spark_state = json.loads(response.read())
    assert "dssm-run" in [app["name"] for app in spark_state["completedapps"] + spark_state["activeapps"]]
    # ... and every run went to the stack's MLflow server
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=state["urls"]["mlflow"])
    experiment = client.get_experiment_by_name(report["dataset"])
    runs = client.search_runs([experiment.experiment_id])
    parent = report["pipeline"]["mlflow_parent_run_id"]  # the flow run's own run, the others nested under it
    assert [r.info.run_id for r in runs if r.data.tags.get("kind") == "flow"] == [parent]
    runs = [r for r in runs if r.info.run_id != parent]
    assert all(r.data.tags["mlflow.parentRunId"] == parent for r in runs)
    assert sorted(r.data.tags["system"] for r in runs) == ["bm25", "lstm", "lstm", "lstm+bm25"]
    assert report["systems"]["lstm"]["mlflow_run_id"] in {r.info.run_id for r in runs}
    champion = client.get_model_version_by_alias(f"dssm-{report['dataset']}", "champion")
    retriever = client.get_model_version_by_alias(f"dssm-{report['dataset']}-retriever", "champion")
    assert champion.tags["retriever_version"] == f"dssm-{report['dataset']}-retriever/{retriever.version}"
    from infra.database import connect, parse

    with connect(parse(pg_stack["url"]), stack.database_record(cfg)["mlflow"]) as conn:  # the runs are in PostgreSQL
        active = conn.execute("SELECT count(*) FROM runs WHERE lifecycle_stage = 'active'").fetchone()[0]
        assert active == len(runs) + 1  # and the parent


def test_two_runs_at_once_on_the_same_servers_leave_the_champion_on_the_best_version(pg_stack, scheduled):
    """Copies of the scheduled run's work dir (its data stages are up to date there), each training another
    seed (seconds), run at once against the same servers and registered model."""
    import mlflow

    state, api, tmp = pg_stack["state"], scheduled["api"], pg_stack["tmp"]
    report = json.loads((scheduled["work"] / "report.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=state["urls"]["mlflow"])
    experiment = client.get_experiment_by_name(report["dataset"])
    champion = client.get_model_version_by_alias(f"dssm-{report['dataset']}", "champion")
    lstm_runs = len(client.search_runs([experiment.experiment_id], "tags.system = 'lstm'"))
    runs_env = {k: v for k, v in pg_stack["env"].items() if k != "PREFECT_RUNNER_POLL_FREQUENCY"}
    dssm, train, procs = [sys.executable, "-m", "dssm.cli"], ["data.batch_size=64", "epochs=2", "model.ncell=16"], {}
    for seed in (2, 3):
        copy = tmp / f"c{seed}"
        shutil.copytree(scheduled["work"], copy, ignore=shutil.ignore_patterns(".lock", "report.json"))
        argv = ["run", "--workdir", str(copy), "--logs", str(scheduled["logs"]), "--judgments"]
        argv += [str(DEFAULT_CATALOGUE), *ONE_HYBRID, "evaluate.retrieval=false", "--no-analyze", "--no-index"]
        argv += ["--train", *train, f"seed={seed}"]
        out = subprocess.PIPE
        procs[seed] = subprocess.Popen([*dssm, *argv], env=runs_env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        outputs = {seed: proc.communicate(timeout=420)[0] for seed, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for seed, proc in procs.items():
        assert proc.returncode == 0, outputs[seed][-3000:]
    reports = [json.loads((tmp / f"c{seed}" / "report.json").read_text()) for seed in procs]
    for r in reports:  # only training, evaluation, register and gate ran, each a flow run on the Prefect server
        stages = {s["stage"]: s for s in r["pipeline"]["stages"]}
        assert [n for n, s in stages.items() if not s["skipped"]] == ["train", "evaluate", "register", "gate"]
        flow_runs = post(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [r["pipeline"]["flow_run_id"]]}}})
        assert [f["state_type"] for f in flow_runs] == ["COMPLETED"]
    gates = [g for r in reports for g in r["gate"]]
    assert len(gates) == 4 and len({g["version"] for g in gates}) == 4  # lstm and lstm+bm25 of each run
    version, best = champion_is_the_best(client, f"dssm-{report['dataset']}")
    assert version in {champion.version} | {g["version"] for g in gates if g["promoted"]}
    assert best >= max(g["ndcg10"] for g in gates)
    trained = client.search_runs([experiment.experiment_id], "tags.system = 'lstm'")
    assert len(trained) == lstm_runs + 4  # 2 train + 2 eval runs


def test_a_cluster_that_lost_its_workers_fails_a_job_within_the_bound_and_the_stack_stops(pg_stack, scheduled):
    """The job waiting for executors fails within the bound, saying why; then `dssm stack down` ends each
    service still up (the worker was killed) on SIGTERM, as a scheduler stops it, within seconds."""
    cfg, state, tmp = pg_stack["cfg"], pg_stack["state"], pg_stack["tmp"]
    os.killpg(state["services"]["spark-worker"]["pid"], signal.SIGKILL)
    started = time.monotonic()
    lost = [sys.executable, "-m", "dssm.cli", "clean", "--input", str(scheduled["logs"])]
    lost += ["--out", str(tmp / "lost"), "--master", state["urls"]["spark"]]
    lost_env = {**os.environ, NO_EXECUTOR_TIMEOUT_ENV: "5"}
    proc = subprocess.run(lost, env=lost_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "has had no executors for 5s" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - started < 120 and not (tmp / "lost").exists()

    # MLflow's recorded process killed: its uvicorn child still answers, but the service is down, and `down`
    # ends the child with its group and leaves the port free
    os.kill(state["services"]["mlflow"]["pid"], signal.SIGKILL)
    time.sleep(1)
    assert urllib.request.urlopen(f"{state['urls']['mlflow']}/health", timeout=10).status == 200  # the orphan
    assert stack.status(cfg.root)["mlflow"] is False and stack.status(cfg.root)["prefect"] is True
    said_down: list[str] = []
    stopped = stack.down(cfg.root, progress=said_down.append)
    assert sorted(stopped) == ["mlflow", "prefect", "spark-master", "spark-worker"]
    seconds = [float(line.split(" by SIGTERM in ")[1].split()[0]) for line in said_down if " by SIGTERM in " in line]
    assert len(seconds) == 3 and max(seconds) < 10, said_down
    assert stack.status(cfg.root) == {}
    for port in (cfg.prefect_port, cfg.mlflow_port):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


@contextmanager
def stack_service(cfg: stack.StackConfig, name: str) -> Iterator[None]:
    """One service of the stack, started with the command and settings `dssm stack up` uses."""
    argv, extra_env = stack._commands(cfg)[name]
    log = cfg.root / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env={**os.environ, **extra_env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        stack._wait(name, stack.health_checks(cfg.urls)[name], proc, time.monotonic() + 180, log)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its session: `prefect server start` runs the server as a child
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigterm_stops_a_served_run_in_flight_pauses_the_schedule_and_the_next_run_resumes(scheduled, tmp_path):
    """`dssm schedule` stopped as schedulers stop it: Prefect's runner alone would let the run in flight
    finish first (a night's run: an hour); here the run stops within seconds, its MLflow runs KILLED, the
    flow run crashed, the schedule paused, nothing of it left running, its checkpoint left to resume from.
    The work dir starts with the scheduled run's data stages, up to date for these logs: the run goes
    straight to training, on a Prefect server of its own (the stack is down by now)."""
    import mlflow

    cfg = stack.StackConfig(root=tmp_path / "stack", prefect_port=free_port())
    work, log = tmp_path / "w", tmp_path / "schedule.log"
    for stage in ("clean", "propensity", "vocab", "negatives"):
        shutil.copytree(scheduled["work"] / stage, work / stage)
    train = ["--train", "data.batch_size=64", "model.ncell=16", "epochs=60", "checkpoint_every=10", "eval_every=100000"]
    run = ["--workdir", str(work), "--logs", str(scheduled["logs"]), "--judgments", str(DEFAULT_CATALOGUE)]
    run += [*ONE_HYBRID, "evaluate.retrieval=false", "--no-index", "--no-analyze", *train]
    with stack_service(cfg, "prefect"):
        api = cfg.urls["prefect"]
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DSSM_SPARK_MASTER")}
        env |= {"PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
        cmd = [sys.executable, "-m", "dssm.cli", "schedule", "--cron", "0 3 * * *", "--name", "stop-probe", *run]
        with open(log, "w") as out:
            serve = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:

            def deployment():
                found = post_when_up(f"{api}/deployments/filter", {}) or []
                return next((d for d in found if d["name"] == "stop-probe"), None)

            served = wait_until("deployment registered", deployment, 120, serve, log)
            create = f"{api}/deployments/{served['id']}/create_flow_run"
            flow_run = wait_until("flow run created", lambda: post_when_up(create, {}), 60, serve, log)  # not at 03:00
            wait_until("training", lambda: (work / "train" / "lstm" / "last.pt").exists(), 300, serve, log)
            family = psutil.Process(serve.pid).children(recursive=True)  # the flow run's process, Spark's JVM
            started = time.monotonic()
            os.kill(serve.pid, signal.SIGTERM)
            assert serve.wait(30) == 128 + signal.SIGTERM, log.read_text()[-3000:]
            assert time.monotonic() - started < 20
            _, left = psutil.wait_procs(family, timeout=10)
            assert not left, [" ".join(p.cmdline()[:4]) for p in left if p.is_running()]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        (state,) = post(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
        # a run that did not stop in time printed its stack (core.stopping._ask_for_stacks) into the log
        assert state["state_type"] == "CRASHED", (state["state"], log.read_text()[-6000:])
        status, _, body = request(f"{api}/deployments/{served['id']}")
        assert status == 200 and json.loads(body)["paused"]  # no run starts until it is served again
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    stopped = mlflow.search_runs(experiment_names=["default-catalogue"], output_format="list")
    statuses = {r.info.run_name: r.info.status for r in stopped}
    assert statuses and set(statuses.values()) == {"KILLED"}, (statuses, log.read_text()[-6000:])  # parent, training
    assert not (work / "eval").exists()
    manifest = Path("clean") / "manifest.json"  # the data stages were not run again
    assert (work / manifest).read_bytes() == (scheduled["work"] / manifest).read_bytes()

    # what the next run resumes from (the same flow as `dssm run`: tests/test_stopping.py resumes it)
    from modeling.checkpoint import read_checkpoint

    assert read_checkpoint(work / "train" / "lstm" / "last.pt")["step"] >= 10


def request(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    """(status, headers, body) of one request, error statuses included."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers or {}, method=method), timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


FOREIGN = "http://attacker.example"
ACAO = "Access-Control-Allow-Origin"


def assert_no_other_origin_or_host(cfg: stack.StackConfig) -> None:
    """The stack's servers grant no other origin or host. Prefect used to answer
    `Access-Control-Allow-Origin: *` to any page, POSTs included; now only the stack's own origin (by
    IP or as localhost) is granted. Both refuse foreign Host headers (a rebound DNS name); MLflow
    refuses cross-origin writes."""
    api, port = cfg.urls["prefect"], cfg.prefect_port
    json_post = {"Content-Type": "application/json"}
    status, headers, _ = request(f"{api}/flow_runs/filter", "POST", {"Origin": FOREIGN, **json_post}, b"{}")
    assert status == 200 and headers.get(ACAO) is None  # answered, but no browser lets the page read it
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    status, headers, body = request(f"{api}/flow_runs/filter", "OPTIONS", {"Origin": FOREIGN, **preflight})
    assert (status, headers.get(ACAO)) == (400, None), body  # so a page's JSON POST is never sent
    for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        status, headers, _ = request(f"{api}/flow_runs/filter", "OPTIONS", {"Origin": own, **preflight})
        assert (status, headers.get(ACAO)) == (200, own)
        assert "POST" in headers.get("Access-Control-Allow-Methods", "")
    status, _, body = request(f"{api}/flow_runs/filter", "POST", {"Host": "attacker.example", **json_post}, b"{}")
    assert status == 400 and b"Invalid host header" in body  # Prefect 3 answered it: infra/prefect_server.py
    status, _, _ = request(f"{api}/health", headers={"Host": f"localhost:{port}"})
    assert status == 200

    mlflow = f"{cfg.urls['mlflow']}/api/2.0/mlflow/experiments"
    status, _, body = request(f"{mlflow}/search?max_results=1", headers={"Host": "attacker.example"})
    assert status == 403 and b"Invalid Host header" in body  # a rebound DNS name is refused
    create = json.dumps({"name": "from-a-web-page"}).encode()
    status, headers, body = request(f"{mlflow}/create", "POST", {"Origin": FOREIGN, **json_post}, create)
    assert status == 403 and b"Cross-origin request blocked" in body and headers.get(ACAO) is None
    status, headers, _ = request(f"{mlflow}/search?max_results=1", headers={"Origin": FOREIGN})
    assert status == 200 and headers.get(ACAO) is None
    own = f"http://127.0.0.1:{cfg.mlflow_port}"
    status, headers, _ = request(f"{mlflow}/search?max_results=1", headers={"Origin": own})
    assert (status, headers.get(ACAO)) == (200, own)

    # the Spark master's and worker's UIs (infra/spark_ui.py), asked with curl as an operator would
    for port in (cfg.spark_ui_port, cfg.spark_worker_ui_port):
        for host, expected in (("evil.example", "403"), (f"evil.example:{port}", "403"), (None, "200"),
                               (f"localhost:{port}", "200")):  # fmt: skip
            argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/json/"]
            answered = subprocess.run([*argv, *(["-H", f"Host: {host}"] if host else [])], capture_output=True,
                                      text=True, timeout=30).stdout  # fmt: skip
            assert answered == expected, (port, host, answered)


def test_one_database_url_gives_each_server_its_own_database_and_driver(postgres_url, tmp_path):
    """`--database` names one PostgreSQL URL; MLflow (psycopg) and Prefect (asyncpg) each get a database
    derived from it (both keep an `alembic_version` table); missing ones are created; a server that
    does not answer, or another kind of URL, is one clear error before any service starts."""
    from sqlalchemy.engine import make_url

    from core.errors import DssmError

    urls = database.service_urls("postgres://team:s3cret@db.example:5433/dssm?sslmode=require")
    assert urls == {
        "mlflow": "postgresql+psycopg://team:s3cret@db.example:5433/dssm_mlflow?sslmode=require",
        "prefect": "postgresql+asyncpg://team:s3cret@db.example:5433/dssm_prefect",  # asyncpg takes no libpq options
    }
    assert database.shown("postgresql+psycopg2://team:s3cret@db.example/x") == "postgresql://team:***@db.example/x"
    # infra/scale-out/compose.yaml gives each server what `--database postgresql://dssm:dssm@postgres:5432/dssm` would
    import yaml

    compose = yaml.safe_load((Path(__file__).parents[1] / "infra" / "scale-out" / "compose.yaml").read_text())
    team = database.service_urls("postgresql://dssm:dssm@postgres:5432/dssm")
    assert compose["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"] == team["mlflow"]
    assert "dssm:dssm" not in compose["services"]["mlflow"]["command"]  # a command line is anyone's to read
    assert compose["services"]["prefect"]["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == team["prefect"]
    with pytest.raises(DssmError, match="'mysql' is not supported"):
        database.service_urls("mysql://root@127.0.0.1/dssm")

    names = database.prepare(postgres_url, progress=lambda _: None)
    base = make_url(postgres_url).database
    assert names == {"mlflow": f"{base}_mlflow", "prefect": f"{base}_prefect"}
    assert database.answers(postgres_url) is None
    assert database.prepare(postgres_url, progress=lambda _: None) == names  # already there: kept

    silent = make_url(postgres_url).set(port=free_port()).render_as_string(hide_password=False)
    cfg = stack.StackConfig(root=tmp_path / "stack", database=silent, **{p: free_port() for p in PORTS})
    with pytest.raises(DssmError, match="does not answer"):
        stack.up(cfg, progress=lambda _: None)
    assert stack.read_state(cfg.root) is None and "refused" in (database.answers(silent) or "")


PORTS = ["prefect_port", "mlflow_port", "spark_port", "spark_ui_port", "spark_worker_ui_port"]
