"""Before a launch: GPU memory that other processes hold on the job's devices.

``gpu.foreign_memory`` says what to do: ``ignore`` them, ``refuse`` to launch, or ``wait`` (up
to ``foreign_wait_s``) for them to let go.  A wait is said at once, whose memory it waits for
(``gpu_wait``: what `start` answers; the job's reason; a ``gpu_wait`` event with the holders),
and its end is noticed from the host's GPU samples, which the daemon takes on a steady interval
anyway (``gpu_interval_s``): the sample that shows the memory gone wakes the launch, no timer.
"""

from __future__ import annotations

import asyncio
import time
from itertools import groupby

import structlog

from supervisor.core.events import EventKind, JobState
from supervisor.core.payloads import ActionData, GpuHolder, GpuWaitData
from supervisor.gpu.nvml import GpuProcess, GpuSample, foreign_processes
from supervisor.jobs.runner._context import RunnerContext, cmdline
from supervisor.jobs.runner._journal import Journal
from supervisor.spec.model import JobSpec

log = structlog.get_logger("supervise.runner")


def holders_line(foreign: list[GpuProcess]) -> str:
    """'GPU 0: pid 1234 (python train.py) holds 40,960 MiB; GPU 1: …'"""
    by_gpu = groupby(sorted(foreign, key=lambda p: (p.gpu_index, p.pid)), key=lambda p: p.gpu_index)
    return "; ".join(f"GPU {gpu}: " + ", ".join(
        f"pid {p.pid} ({cmdline(p.pid)}) holds {'an unknown amount of' if p.used_mib is None else f'{p.used_mib:,}'} MiB"
        for p in procs) for gpu, procs in by_gpu)


class GpuGate:
    """The pre-launch check of a job runner, composed into it: ``clear()`` before each launch."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, stopped: asyncio.Event) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._stopped = stopped  # the runner's stop: ends the wait
        self.waiting: str | None = None  # while the launch waits for GPUs: for what, in one line

    async def clear(self) -> bool:
        """True: launch now.  False: not at all (refused, waited too long, or stopped); the job's
        state says why."""
        gpu = self._spec.gpu
        if gpu.foreign_memory == "ignore":
            return True
        devices = None if gpu.devices == "all" else list(gpu.devices)
        started = time.monotonic()
        deadline = started + gpu.foreign_wait_s
        said: frozenset[tuple[int, int]] = frozenset()
        sample = await self._ctx.gpu.sample()
        try:
            while True:
                foreign = foreign_processes(sample, devices, set()) if sample.available else []
                if not foreign:
                    if said:
                        self._gpus_free(sample, time.monotonic() - started)
                    return True
                who = holders_line(foreign)
                if gpu.foreign_memory == "refuse" or time.monotonic() >= deadline:
                    self._journal.set_job(JobState.FAILED, f"GPUs hold memory of other processes: {who}; "
                                                   "free them or set gpu.foreign_memory='ignore'")
                    return False
                holders = frozenset((p.pid, p.gpu_index) for p in foreign)
                if holders != said:  # said once per set of holders, not once per sample
                    said = holders
                    self._gpu_waiting(foreign, who, gpu.foreign_wait_s - (time.monotonic() - started))
                next_sample = await self._next_sample_unless_stopped(deadline)
                if next_sample is None:
                    self._journal.set_job(JobState.STOPPED, "stopped by user while waiting for GPUs")
                    return False
                sample = next_sample
        finally:
            self.waiting = None

    def _gpu_waiting(self, foreign: list[GpuProcess], who: str, left_s: float) -> None:
        self.waiting = f"waiting for {who}"
        n = self._ctx.store.next_attempt_number(self._spec.name)  # the attempt that waits to launch
        holders = tuple(GpuHolder(p.pid, p.gpu_index, p.used_mib, cmdline(p.pid)) for p in foreign)
        self._journal.record(n, EventKind.GPU_WAIT, f"{self.waiting} (launching when it is freed, "
                             f"for at most {left_s:.0f}s more)", GpuWaitData(holders))
        self._journal.set_job(JobState.WAITING, self.waiting)

    def _gpus_free(self, sample: GpuSample, waited_s: float) -> None:
        """The wait is over: said with the sample that showed it (when, and that it woke the launch)."""
        n = self._ctx.store.next_attempt_number(self._spec.name)
        at = time.strftime("%H:%M:%S", time.localtime(sample.ts)) + f".{int(sample.ts * 1000) % 1000:03d}"
        log.info("GPUs free: launching", job=self._spec.name, waited_s=round(waited_s, 2), woken_by="gpu sample",
                 sample_ts=sample.ts)
        self._journal.record(n, EventKind.ACTION, f"GPUs free (the GPU sample of {at} shows it): launching "
                             f"after waiting {waited_s:.1f}s",
                             ActionData(woken_by="gpu_sample", sample_ts=sample.ts, waited_s=waited_s))

    async def _next_sample_unless_stopped(self, deadline: float) -> GpuSample | None:
        """The host's next GPU sample (its sampling loop wakes us); None when a stop came first.
        At the deadline, a sample taken then."""
        sample = asyncio.ensure_future(self._ctx.gpu.next_sample())
        stop = asyncio.ensure_future(self._stopped.wait())
        try:
            done, _ = await asyncio.wait({sample, stop}, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sample, stop):
                task.cancel()
        if stop in done:
            return None
        if sample in done:
            return sample.result()
        return await self._ctx.gpu.sample()
