"""After a stop: the attempt's processes that NVML still lists holding GPU memory.

A stop that has signalled every process it could find may still leave memory held: a
process stuck in the driver (uninterruptible, or a zombie whose GPU context is not torn
down) is no longer "running" to psutil, yet the GPU is not free; a process of the attempt
that appeared after the kill (found again by tag or cgroup) holds memory as well.  ``stop``
must say so instead of claiming success.  NVML's process list is the witness: a pid it
lists is ours when the stop signalled it, when the runner saw it during the attempt, or
when it still belongs to the attempt by tag, group or cgroup now.

The driver frees a dying process's memory a moment after it ends; a pid is reported only
when it is still listed once that moment (``settle_s``) has passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from supervisor.gpu.nvml import GpuProcess, GpuSample
from supervisor.hosts.base import Host, KillReport, ProcessHandle

# How long a killed process may stay listed while the driver tears its context down before it
# counts as held: room for a slow teardown, short enough that a stop that left memory held
# still answers promptly.
SETTLE_S = 3.0


async def attempt_pids(host: Host, handles: Iterable[ProcessHandle], report: KillReport, known: Iterable[int]) -> set[int]:
    """Every pid that is the attempts': signalled by the stop, seen before, or found now."""
    pids = {pid for pid, _ in report.terminated + report.killed + report.survivors} | set(known)
    for handle in handles:
        pids.add(handle.pid)
        pids |= await host.attempt_pids(handle)
    pids.discard(0)
    return pids


async def still_held(sample: Callable[[], Awaitable[GpuSample]], pids: set[int], *, settle_s: float = SETTLE_S,
                     interval_s: float = 0.1, sleep: Callable[[float], Awaitable[object]] | None = None) -> list[GpuProcess]:
    """The GPU processes among ``pids`` that NVML still lists after ``settle_s`` (none when
    NVML is unavailable: nothing can be seen there, and the kill report stands alone)."""
    pause = sleep or asyncio.sleep
    deadline = time.monotonic() + settle_s
    while True:
        current = await sample()
        if not current.available:
            return []
        held = [p for p in current.processes if p.pid in pids]
        if not held or time.monotonic() >= deadline:
            return held
        await pause(interval_s)


def describe(held: list[GpuProcess], report: KillReport) -> str:
    """One phrase per holder: 'pid 123 python train.py (ended, memory not freed) holds 2048 MiB on GPU 0'."""
    names = dict(report.terminated + report.killed)
    alive = {pid for pid, _ in report.survivors}
    parts = []
    for proc in held:
        if proc.pid in alive:
            state = "still alive"
        elif proc.pid in names:
            state = f"{names[proc.pid]}, ended but its memory is not freed"
        else:
            state = "a process of the attempt the stop did not reach"
        memory = "an unknown amount" if proc.used_mib is None else f"{proc.used_mib} MiB"
        parts.append(f"pid {proc.pid} ({state}) holds {memory} on GPU {proc.gpu_index}")
    return "; ".join(parts)
