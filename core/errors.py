"""The exception types the CLI turns into a one-line error and a non-zero exit."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full file system, or the user's quota on it


class DssmError(Exception):
    """A problem the user can fix (bad path, bad columns, bad data): printed as one line."""


class TransientError(DssmError):
    """A failure that may pass on a retry: a service (Spark master, MLflow server) not reachable yet."""


class NotADssmModel(DssmError):
    """A logged or registered model that this project did not write, or whose files it refuses (no
    checkpoint, an unreadable MLmodel or fusion.json, a checkpoint that is not plain data)."""


class StageFailed(DssmError):
    """A pipeline stage failed: names the stage and its input so the message says where to look."""

    def __init__(self, stage: str, source: str, cause: BaseException):
        self.stage, self.source, self.cause = stage, source, cause
        reason = str(cause).splitlines()[0] if str(cause).strip() else type(cause).__name__
        if not isinstance(cause, DssmError):
            reason = f"{type(cause).__name__}: {reason[:400]}"
        super().__init__(f"stage {stage} failed on {source}: {reason}")

    @property
    def transient(self) -> bool:
        """Worth a retry: not a problem with the data or the settings."""
        return isinstance(self.cause, TransientError) or not isinstance(self.cause, DssmError)


def no_space(path: str | Path, detail: str = "", quota: bool = False) -> DssmError:
    """The error for a write to `path` that found its file system full: the OS's own message names
    no path, and a stage writes to several places (its output, a temp dir, Spark's scratch). It says
    how much space is left where `path` is."""
    what = "disk quota exceeded" if quota else "no space left on device"
    notes = [n for n in (detail, free_space(path)) if n]
    detail = f" ({'; '.join(notes)})" if notes else ""
    return DssmError(f"{what} writing {path}{detail}; free some space there or write elsewhere")


def free_space(path: str | Path) -> str:
    """"N MB free" on the file system of `path` (its nearest existing ancestor), or "" when unknown."""
    import shutil

    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return f"{shutil.disk_usage(where).free / 1e6:,.1f} MB free"
    except OSError:
        return ""


@contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """An OSError ENOSPC or EDQUOT inside becomes `no_space(path, …)`; other errors pass."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        raise no_space(path, "", e.errno == errno.EDQUOT) from None
