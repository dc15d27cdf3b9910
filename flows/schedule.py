"""Scheduled retraining: the retrain flow served as a deployment with a cron schedule.

`dssm schedule --cron "0 3 * * *" [run options]` registers deployment `retrain/NAME` on the Prefect
server in $PREFECT_API_URL and keeps a runner polling it; each scheduled run executes in its own
subprocess. For work pools and workers (a team's set-up) see prefect.yaml and docs/flows.md.
"""

from __future__ import annotations

import argparse
import os

from core.errors import DssmError
from flows.config import RunConfig


def serve_retrain(name: str, cron: str, config: RunConfig, timezone: str = "UTC") -> None:
    """Register the deployment with its schedule and run its scheduled flow runs until stopped."""
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
    retrain.serve(name=name, schedules=[schedule], parameters=parameters, tags=["dssm", "scheduled"], limit=1)


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
