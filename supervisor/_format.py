"""Small text formatters shared by the terminal views (`cli`, `watch`) and the report."""

from __future__ import annotations

import datetime as dt
from typing import Any


def num(value: Any) -> str:
    """A count for display: '?' when unknown, no '.0' on whole numbers."""
    if value is None:
        return "?"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


def timestamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def attempt(run_attempt: int, max_attempts: int, n: int) -> str:
    """'2/3': the run's second attempt of three allowed; ' (#7)' adds the job's attempt number
    when earlier runs make the two differ."""
    return f"{run_attempt}/{max_attempts}" + (f" (#{n})" if run_attempt != n else "")


def size(n_bytes: int) -> str:
    """'812 B', '3.4 MiB'."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n_bytes} B"  # pragma: no cover
