"""Small text formatters shared by the terminal views (`cli`, `watch`) and the report."""

from __future__ import annotations

import datetime as dt
import math
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


def figure(value: Any) -> str:
    """A measured figure (a rate, a loss, tokens/s) for a person: four significant digits, whole
    numbers from 1,000 on (never 1.6666666666666667, never 1.235e+04)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value) or value.is_integer():
        return num(value) if math.isfinite(value) else str(value)
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def cpu_time(seconds: float) -> str:
    """CPU seconds: to the hundredth below a second (a short attempt's 0.8 s is not '0s')."""
    return f"{seconds:.2f}s" if seconds < 1 else duration(seconds)


def attempt(run_attempt: int, max_attempts: int, n: int) -> str:
    """'2/3': the run's second attempt of three allowed; ' (#7)' adds the job's attempt number
    when earlier runs make the two differ."""
    return f"{run_attempt}/{max_attempts}" + (f" (#{n})" if run_attempt != n else "")


def shard(index: int | None) -> str:
    """A shard's name in a column: its index, `gather` for the gather step, `-` for none."""
    return "-" if index is None else ("gather" if index < 0 else str(index))


def size(n_bytes: int) -> str:
    """'812 B', '3.4 MiB'."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n_bytes} B"  # pragma: no cover


def usage(used: Any) -> str:
    """An attempt's usage (usage.AttemptUsage) in one line; '' when nothing is known."""
    if used is None:
        return ""
    parts = []
    if used.cpu_s is not None:
        parts.append(f"cpu {cpu_time(used.cpu_s)}")
    if used.peak_memory_mib is not None:
        sampled = " (sampled)" if getattr(used, "peak_memory_sampled", False) else ""
        parts.append(f"peak memory {size(used.peak_memory_mib * 1024 * 1024)}{sampled}")
    if used.peak_tasks is not None:
        parts.append(f"{used.peak_tasks} tasks at most")
    if used.gpu_peak_mib and used.gpu_hours is not None:
        held = ", ".join(f"GPU {gpu} {mib:,} MiB" for gpu, mib in used.gpu_peak_mib.items())
        parts.append(f"{used.gpu_hours:.2f} GPU-hours ({held} at most)")
    return "  ".join(parts)
