"""`dssm stack up|down|status|env`: the local stack on 127.0.0.1, each service a real process.

Services: an MLflow tracking server (artifacts served from a local root), a Prefect server, and a
Spark standalone master and worker (launched from the pip pyspark package: no Spark download).
Both servers keep their state in sqlite files under STACK_DIR by default, or, with `--database
postgresql://…`, in two PostgreSQL databases derived from that one URL (infra/database.py). Each
service runs in its own session with its log under STACK_DIR/logs/; STACK_DIR/stack.json records
pids, URLs and the database so `down` and `status` work from any later shell. `up` returns only
when every health check passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import DssmError
from infra import database as db
from infra.spark_ui import daemon_env

STATE = "stack.json"


@dataclass
class StackConfig:
    root: Path = Path(".stack")  # state, data and logs of the stack (`--dir`)
    host: str = "127.0.0.1"  # the address every service listens on and answers as
    prefect_port: int = 4200  # the Prefect server's API and UI
    mlflow_port: int = 5000  # the MLflow tracking server
    spark_port: int = 7077  # the Spark master
    spark_ui_port: int = 8080  # the Spark master's web UI
    spark_worker_ui_port: int = 8081  # the Spark worker's web UI
    worker_cores: int = 2  # cores the Spark worker offers
    worker_memory: str = "2g"  # memory the Spark worker offers
    # keep MLflow's and Prefect's state on this PostgreSQL server, e.g. postgresql://postgres@127.0.0.1:5432/dssm,
    # in databases NAME_mlflow and NAME_prefect (created when missing): for a team, as sqlite lets one writer in
    # at a time; empty: sqlite files under --dir (infra/database.py)
    database: str = ""
    timeout: float = 180  # seconds for every service's health check together

    @property
    def urls(self) -> dict[str, str]:
        h = self.host
        return {
            "mlflow": f"http://{h}:{self.mlflow_port}",
            "prefect": f"http://{h}:{self.prefect_port}/api",
            "spark": f"spark://{h}:{self.spark_port}",
            "spark_ui": f"http://{h}:{self.spark_ui_port}",
        }


def environment(urls: dict[str, str]) -> dict[str, str]:
    """What a shell needs to point `dssm run` (and its flow runs) at the stack."""
    return {
        "PREFECT_API_URL": urls["prefect"],
        "MLFLOW_TRACKING_URI": urls["mlflow"],
        "DSSM_SPARK_MASTER": urls["spark"],
    }


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3) as response:
        return json.loads(response.read() or b"null")


def _ok(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except (OSError, ValueError):
        return False


def health_checks(urls: dict[str, str]) -> dict[str, Callable[[], bool]]:
    spark_ui = urls["spark_ui"]
    return {
        "mlflow": lambda: urllib.request.urlopen(f"{urls['mlflow']}/health", timeout=3).status == 200,
        "prefect": lambda: _get_json(f"{urls['prefect']}/health") is True,
        "spark-master": lambda: _get_json(f"{spark_ui}/json/")["status"] == "ALIVE",
        "spark-worker": lambda: _get_json(f"{spark_ui}/json/")["aliveworkers"] >= 1,
    }


def own_origins(host: str, port: int) -> tuple[list[str], list[str]]:
    """(Host headers, browser origins) of a service of the stack: its own address, by IP and as
    localhost. A page elsewhere (another origin, or a rebound DNS name) is not one of them."""
    names = list(dict.fromkeys([host, "localhost"]))
    return [f"{n}:{port}" for n in names], [f"http://{n}:{port}" for n in names]


# What the Prefect UI and clients send cross-origin: JSON bodies, auth, CSRF tokens, API version.
PREFECT_CORS_HEADERS = "Content-Type,Authorization,Prefect-Csrf-Token,Prefect-Csrf-Client,X-Prefect-Api-Version"


def prefect_security(host: str, port: int) -> dict[str, str]:
    """The Prefect server's settings that keep other web pages off its API. Its defaults answer
    every origin (`Access-Control-Allow-Origin: *`); here only the UI's own origin is allowed.
    Prefect 3 has no Host-header allow-list: infra/prefect_server.py adds one."""
    _, origins = own_origins(host, port)
    return {
        "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": ",".join(origins),
        "PREFECT_SERVER_CORS_ALLOWED_METHODS": "GET,POST,PUT,PATCH,DELETE",
        "PREFECT_SERVER_CORS_ALLOWED_HEADERS": PREFECT_CORS_HEADERS,
    }


# No job runner: MLflow's GenAI jobs are none of the project's, and the runner's process made the
# server start ~3 s and stop ~2 s slower (10 s on a busy core)
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _commands(cfg: StackConfig) -> dict[str, tuple[list[str], dict[str, str]]]:
    import pyspark

    root = cfg.root.resolve()
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    stores = db.service_urls(cfg.database) if cfg.database else {}
    backend = stores.get("mlflow", f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    spark_env = {
        "SPARK_LOCAL_IP": cfg.host,  # every port, the UIs' too, on that address only
        "SPARK_WORKER_DIR": str(root / "spark" / "work"),
        "SPARK_LOG_DIR": str(root / "logs"),
        "PYSPARK_PYTHON": sys.executable,  # executors run the project's parser: the same interpreter
        # the UIs answer the stack's own host names only, as MLflow and Prefect do (infra/spark_ui.py)
        **daemon_env(root, list(dict.fromkeys([cfg.host, "localhost"]))),
    }
    mlflow_hosts, mlflow_origins = own_origins(cfg.host, cfg.mlflow_port)
    prefect_env = {"PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if "prefect" in stores:  # else Prefect's default: sqlite under PREFECT_HOME
        prefect_env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = stores["prefect"]
    return {
        "mlflow": (
            [sys.executable, "-m", "mlflow", "server",
             "--artifacts-destination", str(root / "mlflow" / "artifacts"),
             "--host", cfg.host, "--port", str(cfg.mlflow_port), "--workers", "1",
             "--allowed-hosts", ",".join(mlflow_hosts), "--cors-allowed-origins", ",".join(mlflow_origins)],
            # the store's URL (its password) in the environment, which only this user reads: every local
            # user reads a command line (`ps`)
            {"MLFLOW_BACKEND_STORE_URI": backend, **MLFLOW_SERVER_ENV},
        ),
        "prefect": (
            [sys.executable, "-m", "infra.prefect_server", "--host", cfg.host, "--port", str(cfg.prefect_port),
             "--allowed-hosts", ",".join(dict.fromkeys([cfg.host, "localhost"]))],
            prefect_env | prefect_security(cfg.host, cfg.prefect_port),
        ),
        "spark-master": (
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", cfg.host,
             "--port", str(cfg.spark_port), "--webui-port", str(cfg.spark_ui_port)],
            spark_env,
        ),
        "spark-worker": (
            [spark_class, "org.apache.spark.deploy.worker.Worker", cfg.urls["spark"],
             "--cores", str(cfg.worker_cores), "--memory", cfg.worker_memory,
             "--webui-port", str(cfg.spark_worker_ui_port)],
            spark_env,
        ),
    }  # fmt: skip


def read_state(root: Path) -> dict[str, Any] | None:
    path = Path(root) / STATE
    return json.loads(path.read_text()) if path.exists() else None


def up(cfg: StackConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Start every service that is not already healthy and wait for all health checks."""
    state = read_state(cfg.root)
    if state is not None and all(status(cfg.root).values()):
        progress(f"stack already up ({cfg.root / STATE})")
        return state
    if state is not None:
        down(cfg.root, progress)
    for sub in ("logs", "mlflow", "prefect", "spark/work"):
        (cfg.root / sub).mkdir(parents=True, exist_ok=True)
    checks = health_checks(cfg.urls)
    busy = [name for name, check in checks.items() if _ok(check)]
    if busy:
        raise DssmError(f"something already answers where the stack's {', '.join(busy)} should start; change the port")
    taken = [port for port in _ports(cfg) if not _free(cfg.host, port)]
    if taken:  # a process that is not one of ours holds it: say so now, not after the health-check timeout
        raise DssmError(f"port(s) {', '.join(map(str, taken))} on {cfg.host} are in use by another process")
    database = database_record(cfg)
    if cfg.database:  # the server answers, the drivers are there, the databases exist: before any process starts
        db.prepare(cfg.database, progress)
    config = {k: str(v) for k, v in asdict(cfg).items()} | {"database": database["url"]}  # no password on disk
    state = {"config": config, "urls": cfg.urls, "database": database, "services": {}}
    deadline = time.monotonic() + cfg.timeout
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, (argv, extra_env) in _commands(cfg).items():
            log_path = cfg.root.resolve() / "logs" / f"{name}.log"
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    env={**os.environ, **extra_env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # outlives this command; `down` stops its whole group
                )
            procs[name] = proc
            state["services"][name] = {"pid": proc.pid, "log": str(log_path)}
            _write_state(cfg.root, state)
            progress(f"started {name} (pid {proc.pid}, log {log_path})")
            if name == "spark-master":  # the worker registers with a running master
                _wait(name, checks[name], proc, deadline, log_path)
        for name, check in checks.items():
            info = state["services"][name]
            _wait(name, check, procs.get(name), deadline, Path(info["log"]))  # an exited service fails at once
            progress(f"{name}: healthy")
    except BaseException:
        down(cfg.root, lambda _: None)
        raise
    return state


def database_record(cfg: StackConfig) -> dict[str, Any]:
    """Where the servers keep their state, as stack.json records it and `status`/`env`/`down` report it."""
    if not cfg.database:
        root = cfg.root.resolve()
        return {
            "kind": "sqlite",
            "url": "",
            "mlflow": f"sqlite:///{root / 'mlflow' / 'mlflow.db'}",
            "prefect": f"sqlite:///{root / 'prefect' / 'prefect.db'}",
        }
    names = db.databases(cfg.database)
    return {"kind": "postgresql", "url": db.shown(cfg.database)} | names


def describe_database(state: dict[str, Any]) -> str:
    """One line: the database the recorded stack uses."""
    record = state.get("database") or {"kind": "sqlite", "mlflow": "?", "prefect": "?"}
    if record["kind"] == "sqlite":
        return f"sqlite (one writer at a time): MLflow {record['mlflow']}, Prefect {record['prefect']}"
    return f"PostgreSQL {record['url']}: MLflow in database {record['mlflow']}, Prefect in {record['prefect']}"


def _ports(cfg: StackConfig) -> list[int]:
    return [cfg.prefect_port, cfg.mlflow_port, cfg.spark_port, cfg.spark_ui_port, cfg.spark_worker_ui_port]


def _free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _wait(name: str, check: Callable[[], bool], proc, deadline: float, log: Path) -> None:
    while not _ok(check):
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise DssmError(f"stack: {name} did not become healthy; the end of {log}:\n{tail}")
        time.sleep(0.5)


def _write_state(root: Path, state: dict[str, Any]) -> None:
    tmp = Path(root) / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, Path(root) / STATE)


def _alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child that exited: reaped, gone
            return False
    except ChildProcessError:
        pass  # started by another command: not ours to reap
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Whether any process of the process group `pgid` (a service's session: the recorded pid and its
    children, such as MLflow's uvicorn) is still running; our own exited leader is reaped first."""
    _alive(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def down(root: Path, progress: Callable[[str], None] = print, grace: float = 20) -> list[str]:
    """Stop the stack's services: SIGTERM to each one's whole process group (its recorded process may be
    gone while a child still serves), SIGKILL after `grace` seconds; then check their ports are free."""
    state = read_state(root)
    if state is None:
        progress(f"no stack recorded in {root}")
        return []
    stopped = []
    for name, info in reversed(list(state["services"].items())):
        pid, started, how = info["pid"], time.monotonic(), ""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            if not _group_alive(pid):
                break
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while _group_alive(pid) and time.monotonic() < end:
                time.sleep(0.2)
            how = f" by {sig.name} in {time.monotonic() - started:.1f} s"
        stopped.append(name)
        progress(f"stopped {name}{how}")
    config = state.get("config", {})
    keys = ("prefect_port", "mlflow_port", "spark_port", "spark_ui_port")
    ports = {k.removesuffix("_port"): config.get(k) for k in keys}
    held = [f"{k} {p}" for k, p in ports.items() if p and not _free(config.get("host", "127.0.0.1"), int(p))]
    (Path(root) / STATE).unlink()
    if held:
        raise DssmError(f"stack down: port(s) still in use after stopping every service: {', '.join(held)}")
    return stopped


def status(root: Path) -> dict[str, bool]:
    """Each recorded service: is its recorded process alive, and does its health check pass? A service whose
    process died is down even if a child of it still answers (it would outlive the next `down`)."""
    state = read_state(root)
    if state is None:
        return {}
    checks = health_checks(state["urls"])
    return {name: _alive(info["pid"]) and _ok(checks[name]) for name, info in state["services"].items()}


def add_arguments(p) -> None:
    """`dssm stack`'s options: the action and the stack's directory, then StackConfig's fields (for `up`)."""
    from core.options import add_config_options

    p.add_argument("action", choices=["up", "down", "status", "env"])
    default = StackConfig().root
    p.add_argument("--dir", type=Path, default=default, help=f"state, data and logs of the stack (default: {default})")
    # the host stays 127.0.0.1 on the command line: the stack is one machine's (a team's goes through infra/scale-out)
    add_config_options(p.add_argument_group("up: the services"), StackConfig, skip=["root", "host"])


def config_from_args(args) -> StackConfig:
    """`dssm stack up`'s StackConfig: the flags given over its defaults, in --dir."""
    from core.options import config_from_options

    return config_from_options(StackConfig, args, root=args.dir)


def command(args) -> None:
    """`dssm stack up|down|status|env`."""
    if args.action == "up":
        cfg = config_from_args(args)
        state = up(cfg)
        print('stack up; point a shell at it with:  eval "$(dssm stack env)"')
        for name, url in state["urls"].items():
            print(f"  {name:<9} {url}")
        print(f"  database  {describe_database(state)}")
    elif args.action == "down":
        state = read_state(args.dir)
        down(args.dir)
        if state is not None and state.get("database", {}).get("kind") == "postgresql":
            record = state["database"]
            print(f"the databases {record['mlflow']} and {record['prefect']} keep their data ({record['url']})")
    elif args.action == "status":
        health = status(args.dir)
        if not health:
            raise DssmError(f"no stack recorded in {args.dir}; start one with `dssm stack up`")
        for name, ok in health.items():
            print(f"{name:<13} {'healthy' if ok else 'DOWN'}")
        state = read_state(args.dir) or {}
        print(f"database      {describe_database(state)}")
        if state.get("database", {}).get("kind") == "postgresql":
            # the recorded URL has no password: libpq takes it from PGPASSWORD or ~/.pgpass
            problem = db.answers(state["database"]["url"])
            print(f"database      {'answers' if problem is None else 'DOWN: ' + problem}")
            health["database"] = problem is None
        if not all(health.values()):
            raise DssmError("some services are down (their logs are in " + str(args.dir / "logs") + ")")
    else:
        state = read_state(args.dir)
        if state is None:
            raise DssmError(f"no stack recorded in {args.dir}; start one with `dssm stack up`")
        print(f"# database: {describe_database(state)}")
        for key, value in environment(state["urls"]).items():
            print(f"export {key}={value}")
