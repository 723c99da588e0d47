"""Per-job resource limits as the kernel enforces them (cgroup v2, as systemd's ``MemoryMax=``,
``CPUQuota=`` and ``TasksMax=`` do), and what an attempt's cgroup says when one of them ended it.

The spec's `[limits]` table (spec/tables.py) becomes a ``ResourceLimits``; the local host writes it to
the attempt's own cgroup before the command starts (hosts/local/cgroup.py) and reads back, as the
attempt ends, whether the kernel enforced it (``LimitHit``); the watchdog judges by that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# systemd's suffixes for sizes: powers of 1024 (MemoryMax=8G is 8 GiB); "8GiB" is taken as well.
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# At most 20 digits: a longer number would overflow to infinity on its way to bytes.
_SIZE_RE = re.compile(r"(\d{1,20}(?:\.\d{1,9})?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*%")
MIN_MEMORY_BYTES = 1 << 20  # below a MiB the launch wrapper's own shell could not start
MAX_MEMORY_BYTES = 1 << 60
MAX_CPU_PERCENT = 100_000  # a thousand cores
MAX_TASKS = 4_194_304  # the kernel's own pid_max ceiling
CPU_PERIOD_US = 100_000  # cpu.max's period, as systemd writes it for CPUQuota=


class Controller(StrEnum):
    """The cgroup v2 controllers that enforce the limits."""

    MEMORY = "memory"
    CPU = "cpu"
    PIDS = "pids"


@dataclass(frozen=True)
class ResourceLimits:
    """What an attempt may use; None: no limit of that kind."""

    memory_max_bytes: int | None = None
    cpu_max_percent: float | None = None  # 100: one core's time
    tasks_max: int | None = None  # processes and threads of the program and its descendants

    def controllers(self) -> frozenset[Controller]:
        """The controllers these limits need in the attempt's cgroup."""
        needed = {Controller.MEMORY: self.memory_max_bytes, Controller.CPU: self.cpu_max_percent,
                  Controller.PIDS: self.tasks_max}
        return frozenset(c for c, value in needed.items() if value is not None)

    def cgroup_files(self) -> dict[str, str]:
        """The cgroup files to write, and what: the interface files' own formats."""
        files: dict[str, str] = {}
        if self.memory_max_bytes is not None:
            files["memory.max"] = str(self.memory_max_bytes)
            # No swap beyond the limit: swapped out, a job over its limit crawls instead of ending.
            files["memory.swap.max"] = "0"
        if self.cpu_max_percent is not None:
            quota = max(1000, round(self.cpu_max_percent * CPU_PERIOD_US / 100))
            files["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
        if self.tasks_max is not None:
            # The launch wrapper's shell stays in the cgroup beside the program: not counted against it.
            files["pids.max"] = str(self.tasks_max + 1)
        return files

    def describe(self) -> str:
        parts = []
        if self.memory_max_bytes is not None:
            parts.append(f"memory_max {shown_bytes(self.memory_max_bytes)}")
        if self.cpu_max_percent is not None:
            parts.append(f"cpu_max {self.cpu_max_percent:g}%")
        if self.tasks_max is not None:
            parts.append(f"tasks_max {self.tasks_max}")
        return ", ".join(parts)


class LimitKind(StrEnum):
    MEMORY = "memory_max"
    TASKS = "tasks_max"


@dataclass(frozen=True)
class LimitHit:
    """The kernel enforced one of the attempt's own limits: its OOM killer ended a process at
    ``memory.max``, or a fork or thread was refused at ``pids.max``.  Read from the attempt's
    cgroup (its own interface files), so a re-adopted attempt is judged as a fresh one."""

    kind: LimitKind
    limit: int  # bytes for memory_max, tasks for tasks_max (as the spec wrote it)
    events: int  # memory.events oom_kill, or pids.events max

    def describe(self) -> str:
        if self.kind is LimitKind.MEMORY:
            return f"its memory limit {shown_bytes(self.limit)} (memory.events oom_kill {self.events})"
        return f"its task limit {self.limit} (pids.events max {self.events}: forks refused)"


def refusal(limits: ResourceLimits, available: frozenset[Controller], why: str) -> str | None:
    """Why ``limits`` cannot be enforced where only ``available`` controllers are enabled, in one
    line that says what to do; None when they can."""
    missing = [c for c in Controller if c in limits.controllers() - available]
    if not missing:
        return None
    names = ", ".join(c.value for c in missing)
    return (f"[limits] needs a writable cgroup v2 with the {names} controller{'s' if len(missing) > 1 else ''} "
            f"for attempts on host local ({why or 'no cgroup of its own for each attempt'}); remove [limits], or "
            "give the daemon a delegated cgroup without processes of its own (systemd's Delegate=yes) and name it "
            "in the setting cgroup_root")


def parse_memory(value: object) -> int:
    """``MemoryMax=``'s syntax: bytes, or a number with K, M, G or T (powers of 1024; "8GiB" too)."""
    if isinstance(value, bool):
        raise ValueError(f"a size such as \"8G\" or \"512MiB\"; got {value}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        text = value.strip()
        if _PERCENT_RE.fullmatch(text):
            raise ValueError(f"a size such as \"8G\", not a share of the machine's memory ({value!r}): "
                             "the same spec would mean another limit on another machine")
        match = _SIZE_RE.fullmatch(text)
        if match is None:
            raise ValueError(f"a size such as \"8G\" or \"512MiB\" (K, M, G, T: powers of 1024); got {value!r}")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    else:
        raise ValueError(f"a size such as \"8G\" or \"512MiB\"; got {value!r}")
    if not MIN_MEMORY_BYTES <= size <= MAX_MEMORY_BYTES:
        raise ValueError(f"between 1M and 1024P; got {value!r}")
    return size


def parse_cpu(value: object) -> float:
    """``CPUQuota=``'s syntax: a percentage of one core's time ("200%" is two cores)."""
    match = _PERCENT_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"a percentage of one core, such as \"200%\" for two cores; got {value!r}")
    percent = float(match.group(1))
    if not 1 <= percent <= MAX_CPU_PERCENT:
        raise ValueError(f"between 1% and {MAX_CPU_PERCENT}%; got {value!r}")
    return percent


def parse_tasks(value: object) -> int:
    """``TasksMax=``'s count: processes and threads of the program and all it starts."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a whole number of tasks (processes and threads), such as 512; got {value!r}")
    if not 1 <= value <= MAX_TASKS:
        raise ValueError(f"between 1 and {MAX_TASKS}; got {value}")
    return value


def shown_bytes(size: int) -> str:
    """A size as people read it: 512 MiB, 8 GiB, 1.5 GiB."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:.1f}".removesuffix(".0") + f" {name}"
    return f"{size} B"
