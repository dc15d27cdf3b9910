"""A windowed run's dates: a run-wide fact every stage of the run shares (clean reads their partitions,
register tags the run date, the flow names its parent run after it)."""

from __future__ import annotations

from datetime import date, timedelta

from core.errors import DssmError


def window_dates(run_date: str, days: int) -> list[str]:
    """The `days` dates that end with `run_date`, oldest first."""
    try:
        last = date.fromisoformat(run_date)
    except ValueError:
        raise DssmError(f"run_date must be a date YYYY-MM-DD, got {run_date!r}") from None
    if days < 1:
        raise DssmError(f"window_days must be positive, got {days}")
    return [(last - timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]
