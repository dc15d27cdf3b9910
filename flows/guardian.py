"""A watcher that ends a command's helper processes when the command dies without cleaning up.

`dssm run` starts helpers it does not own the lifetime of: Prefect's ephemeral API server, the
Spark JVM, torchrun ranks. They stop when the command exits normally; a SIGKILL of the command's
pid alone would orphan them (the ephemeral server would serve on for ever). The guardian is a small
separate process that records the command's descendants every second and, once the command is gone,
terminates those still running (SIGTERM, then SIGKILL after a grace period).

    python -m flows.guardian PID
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from core.stopping import end_processes

POLL_SECONDS = 1.0
GRACE_SECONDS = 5.0


_started: subprocess.Popen | None = None


def start_guardian() -> subprocess.Popen:
    """Watch this process (one guardian per process); it exits by itself once this process is gone."""
    import os

    global _started
    if _started is not None and _started.poll() is None:
        return _started
    _started = subprocess.Popen(
        [sys.executable, "-m", "flows.guardian", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the command's group does not reach it before it acts
    )
    return _started


def watch(pid: int) -> list[int]:
    """Record `pid`'s descendants until it ends, then end them; returns the pids it had to stop."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    me = psutil.Process().pid
    known: dict[int, psutil.Process] = {}
    while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
        try:
            for child in parent.children(recursive=True):
                if child.pid != me:
                    known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
        time.sleep(POLL_SECONDS)
    left = [p for p in known.values() if p.is_running()]  # is_running compares create times: no reused pid
    end_processes(left, GRACE_SECONDS)
    return [p.pid for p in left]


if __name__ == "__main__":
    watch(int(sys.argv[1]))


def ephemeral_api_gone(wait: float = 2.0) -> bool:
    """Whether this process ran its flow on Prefect's ephemeral API server and that server is going or
    gone (a SIGTERM to the process group ends it with the command): the flow run's state can no longer
    be recorded, and Prefect's engine would retry it for up to a minute. Within `wait` seconds: a server
    that answers is alive (the signal reached this process alone); one that exits or refuses is gone."""
    import httpx
    from prefect.server.api.server import SubprocessASGIServer

    servers = [s for s in SubprocessASGIServer._instances.values() if getattr(s, "server_process", None)]
    deadline = time.monotonic() + wait
    while servers:
        alive = [s for s in servers if s.server_process.poll() is None]
        if not alive:
            return True
        try:
            if any(httpx.get(f"{s.api_url}/health", timeout=0.3).status_code == 200 for s in alive):
                return False
        except httpx.ConnectError:  # it stopped listening: shutting down
            return True
        except httpx.HTTPError:  # no answer yet: ask again
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return False
