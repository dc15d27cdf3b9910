"""Scheduled retraining: the retrain flow served as a deployment with a cron schedule.

`dssm schedule --cron "0 3 * * *" [run options]` registers deployment `retrain/NAME` on the Prefect
server in $PREFECT_API_URL and keeps a runner polling it; each scheduled run executes in its own
subprocess. SIGTERM or SIGINT stops the runs in flight within seconds, pauses the schedule and exits.
For work pools and workers (a team's set-up) see prefect.yaml and docs/flows.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

from core.errors import DssmError
from flows.config import RunConfig


def serve_retrain(name: str, cron: str, config: RunConfig, timezone: str = "UTC") -> None:
    """Register the deployment with its schedule and run its scheduled flow runs until stopped."""
    from prefect.runner import Runner
    from prefect.schedules import Cron

    from flows.retrain import retrain

    if not os.environ.get("PREFECT_API_URL"):
        raise DssmError(
            "a schedule needs a Prefect server that outlives this command: start one with `dssm stack up` "
            'and `eval "$(dssm stack env)"`, or set PREFECT_API_URL'
        )
    try:
        schedule = Cron(cron, timezone=timezone)
    except ValueError as e:
        raise DssmError(f"--cron {cron!r}: {str(e).splitlines()[0]}") from None
    # Flow runs start in subprocesses of this runner: relative paths must not depend on their cwd.
    parameters = {"config": config.absolute().to_dict()}  # every key editable in the Prefect UI
    # limit=1: a run that outlasts the interval makes the next one wait, never share the work dir.
    # pause_on_shutdown: a stopped schedule starts no run until it is served again.
    runner = Runner(name=name, pause_on_shutdown=True, limit=1)
    tags = ["dssm", "scheduled"]
    deployment = runner.add_flow(retrain, name=name, schedules=[schedule], parameters=parameters, tags=tags)
    # Prefect's runner takes SIGTERM to mean "finish the runs in flight, then exit" (a night's run can take an
    # hour); a scheduler's SIGTERM means "stop within seconds": the runs in flight are stopped as `dssm run` is
    runner.handle_sigterm = stop_runs_in_flight
    previous = signal.signal(signal.SIGINT, stop_runs_in_flight)
    try:
        asyncio.run(runner.start())
    finally:
        signal.signal(signal.SIGINT, previous)
        pause(deployment)  # the runner's own pause on shutdown is cut short when a stop cancels its loop


def pause(deployment: object) -> None:
    """Pause the deployment's schedule: a stopped `dssm schedule` starts no run until it is served again."""
    import logging

    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            client.pause_deployment(deployment)
    except Exception as e:  # the server may be gone too: the stop goes on
        logging.getLogger("dssm.flow").warning("could not pause deployment %s: %s", deployment, e)


def stop_runs_in_flight(signum: int, frame: object) -> None:
    """SIGTERM or SIGINT to `dssm schedule`: each flow run in flight (a child process of the runner) gets
    SIGTERM and stops as `dssm run` does (its stage publishes nothing, its MLflow runs end KILLED, the flow
    run crashes and the next run resumes); this process then exits with 128 + the signal, its schedule
    paused, at most GRACE_SECONDS later (core/stopping.py)."""
    import psutil

    from core.stopping import Stopped, begin

    begin(signum)
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.terminate()
    raise Stopped(signum)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm schedule`'s options: the cron schedule, then the same run config as `dssm run`."""
    from flows.config import add_run_arguments

    p.add_argument("--cron", required=True, help='cron expression, e.g. "0 3 * * *" (03:00 every day)')
    p.add_argument("--timezone", default="UTC", help="the cron expression's time zone (default: %(default)s)")
    p.add_argument("--name", default="scheduled", help="deployment name (default: %(default)s)")
    add_run_arguments(p)


def command(args: argparse.Namespace) -> None:
    """`dssm schedule`."""
    from flows.config import config_from_args

    serve_retrain(args.name, args.cron, config_from_args(args), args.timezone)
