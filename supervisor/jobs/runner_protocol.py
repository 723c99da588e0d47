"""What the jobs' owner (owner.py), its stops (stopping.py), recovery (recovery.py) and the pipelines
ask of a job's runner, whichever kind it is: ``JobRunner`` (runner/_job.py) for a job, ``ShardedJob``
(sharding.py) for a sharded one.  They hold a ``Runner`` and never ask which kind it is: mypy
--strict checks that both kinds have every member here."""

from __future__ import annotations

import asyncio
from typing import Protocol

from supervisor.core.errors import SuperviseError
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.base import KillReport
from supervisor.hosts.stacks import StackDump
from supervisor.jobs.runner import StartNews
from supervisor.jobs.snapshot import RunnerSnapshot


class Runner(Protocol):
    @property
    def task(self) -> asyncio.Task[None] | None:
        """The runner's loop, once started: its end is the runner's."""

    @property
    def news(self) -> StartNews:
        """What `start` awaits: the first attempt running, or a wait said at once."""

    @property
    def running(self) -> bool: ...

    @property
    def error(self) -> SuperviseError | None:
        """What ended the runner, if an error did (`start` reports it)."""

    @property
    def gpu_wait(self) -> str | None:
        """While a launch waits for GPU memory other processes hold: for what, in one line."""

    def snapshot(self) -> RunnerSnapshot:
        """What readers (status, metrics) see now: a frozen copy."""

    async def stop(self, grace_s: float | None = None) -> KillReport:
        """No more relaunches; every attempt running is killed (its tree: TERM, wait, KILL)."""

    async def detach(self) -> None:
        """The daemon is shutting down: stop watching, leave the job running for the next daemon."""

    def hold(self) -> str:
        """`supervise hold`: postpone any kill until ``release``; what it did, in one line."""

    def release(self) -> str:
        """`supervise release`: let kills come again."""

    async def gpus_sampled(self, host: str, sample: GpuSample) -> None:
        """A new sample of ``host``'s GPUs."""

    async def gpu_fault(self, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
        """Whether the fault concerns the job (and was recorded and alerted)."""

    async def stacks_now(self) -> StackDump | None:
        """`supervise stack`: its running processes' stacks now (None: none is running)."""
