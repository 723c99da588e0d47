"""A straggler the watchdog found, told: which process it is (its pid, host and GPU, as far as
the daemon can tell), stored as a `straggler` event with its stack when stacks can be taken, and
alerted like a slow step.  Never a kill: the stall rules judge a rank that stops.

Each report runs off the watch loop (reading processes' environments, a py-spy dump): the log
is read on meanwhile."""

from __future__ import annotations

import asyncio
import re

import psutil

from supervisor.core.errors import SuperviseError
from supervisor.core.events import EventKind
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.payloads import StragglerData
from supervisor.hosts import stacks
from supervisor.hosts.base import StackDumper
from supervisor.hosts.stacks import StackDump, stacks_data
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.watchdog import Straggler, fine_duration

_PID = re.compile(r"\bpid=(\d+)\b")
_RANK = re.compile(r"\brank=(\d+)\b")
_TEE = re.compile(r"\btee=[A-Za-z_]+?(\d+)\b")  # torchrun --tee's "[default1]:": the local rank


def reason(s: Straggler) -> str:
    total = s.total if s.total is not None else "?"
    return (f"{s.bar} at {s.done}/{total}: {fine_duration(s.step_s)}/it for {s.steps} steps in a row, over "
            f"{s.factor:g} x its {s.peers} peers' median {fine_duration(s.peers_rate_s)}/it")


class StragglerReports:
    def __init__(self, ctx: RunnerContext, journal: Journal, alerts: Alerts) -> None:
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts

    def found(self, live: Live, found: list[Straggler]) -> None:
        for straggler in found:
            self._alerts.track(asyncio.create_task(self._report(live, straggler),
                                                   name=f"straggler:{live.row.tag}:{straggler.process}"))

    async def _report(self, live: Live, s: Straggler) -> None:
        ctx = self._ctx
        pid = await self._pid_of(live, s.process)
        gpu = _gpu_of(ctx, pid)
        data = StragglerData(s.probe, s.bar, s.process, s.done, s.total, round(s.step_s, 6),
                             None if s.rate_s is None else round(s.rate_s, 6), round(s.peers_rate_s, 6), s.peers,
                             s.factor, s.steps, pid, ctx.host.name, gpu)
        where = ", ".join(part for part in (f"pid {pid}" if pid else "", f"host {ctx.host.name}",
                                            f"GPU {gpu}" if gpu is not None else "") if part)
        said = f"straggler {s.process} ({where}): {reason(s)}"
        self._journal.record(live.row.n, EventKind.STRAGGLER, said, data)
        dump = await self._stack(live, pid)
        if dump is not None:
            self._journal.record(live.row.n, EventKind.STACKS, f"stacks at the straggler warning ({s.process}): "
                                 f"{dump.summary()}", stacks_data(dump))
        await self._alerts.send(live, notices.straggler(self._alerts.about(live), said, s.process, pid,
                                                        None if dump is None else dump.summary()))

    async def _pid_of(self, live: Live, process: str) -> int | None:
        """The process's pid: named by its lines' prefix, else, on this machine, the attempt's
        process whose environment says that rank (torchrun sets RANK and LOCAL_RANK)."""
        named = _PID.search(process)
        if named:
            return int(named.group(1))
        rank, local = _RANK.search(process), _TEE.search(process)
        if self._ctx.host.name != LOCAL_HOST or (rank is None and local is None):
            return None
        want = ("RANK", rank.group(1)) if rank is not None else ("LOCAL_RANK", local.group(1) if local else "")
        try:
            pids = await self._ctx.host.attempt_pids(live.handle)
        except SuperviseError:
            return None
        return await asyncio.to_thread(_with_env, pids, *want)

    async def _stack(self, live: Live, pid: int | None) -> StackDump | None:
        host = self._ctx.host
        if not isinstance(host, StackDumper):
            return None
        pending = live.stacks_pending
        if pending is not None and not pending.done():
            await asyncio.wait({pending}, timeout=stacks.PER_PROCESS_S + 30)  # one py-spy at a time
        try:
            dump = await asyncio.wait_for(host.dump_stacks(live.handle, stacks.PER_PROCESS_S), stacks.PER_PROCESS_S + 30)
        except (SuperviseError, TimeoutError) as exc:
            return StackDump((), f"no stacks: {exc or 'timed out'}")
        mine = tuple(p for p in dump.processes if p.pid == pid)
        return StackDump(mine, dump.note) if mine else dump  # its own stack, when it is among them


def _with_env(pids: set[int], name: str, value: str) -> int | None:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).environ().get(name) == value:
                found.append(pid)
        except psutil.Error:
            continue
    return min(found) if found else None  # a rank's own children (data loaders) inherit its environment


def _gpu_of(ctx: RunnerContext, pid: int | None) -> int | None:
    sample = ctx.gpu.latest()
    if pid is None or sample is None:
        return None
    return next((p.gpu_index for p in sample.processes if p.pid == pid), None)
