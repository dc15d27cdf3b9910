"""One writer at a time: an exclusive lock that names who holds it.

Two commands writing one output (two `dssm train` into one run directory, two `dssm index --out` at once)
would each delete or overwrite what the other wrote, and both exit 0. So every command that writes an
output holds `output_lock(OUT)` (a lock file beside it, `.NAME.lock`) while it checks, builds and
publishes, and a second one fails at once, naming the holder's pid and command line; `dssm run` holds its
work dir's the same way. The lock is a flock: the kernel releases it when its holder exits, however it
exits, so a killed writer never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.errors import DssmError


def _command_line() -> str:
    argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    return shlex.join(argv)[:300]


@contextmanager
def holding(lock: Path, subject: str, kind: str = "writer") -> Iterator[None]:
    """Hold an exclusive flock on the file `lock` (created) for the block; when another process holds it, a
    DssmError at once: "SUBJECT is in use by another KIND (pid N: COMMAND)"."""
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise DssmError(f"{subject} is in use by another {kind} ({holder}); wait for it or stop it") from None
        handle.seek(0)
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}: {_command_line()}\n")
        handle.flush()
        yield


def lock_file(out: Path) -> Path:
    """Where the lock of output `out` lives: beside it, hidden, so it is never one of its files."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One writer of the output `out` at a time (see the module's docstring)."""
    with holding(lock_file(out), str(out)):
        yield
