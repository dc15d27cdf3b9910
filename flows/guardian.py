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
