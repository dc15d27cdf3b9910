"""Scheduled retraining: the retrain flow served as a deployment with a cron schedule.

`dssm schedule --cron "0 3 * * *" [run options]` registers deployment `retrain/NAME` on the Prefect
server in $PREFECT_API_URL and keeps a runner polling it; each scheduled run executes in its own
subprocess. For work pools and workers (a team's set-up) see prefect.yaml and docs/flows.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dssm.errors import DssmError


def serve_retrain(name: str, cron: str, parameters: dict[str, Any], timezone: str = "UTC") -> None:
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
    for key in ("workdir", "judgments", "logs"):
        if parameters.get(key) and "://" not in parameters[key]:
            parameters[key] = str(Path(parameters[key]).resolve())
    # limit=1: a run that outlasts the interval makes the next one wait, never share the work dir.
    retrain.serve(name=name, schedules=[schedule], parameters=parameters, tags=["dssm", "scheduled"], limit=1)
