"""A runner's alerts, composed into the runner and given to the watch: what ``notices`` composes is
sent here, at the points the runner reaches (an attempt judged, the job given up or done, a phase
reached, a bar moved).  Alerts only say: what is decided of a verdict, and every kill, is
``_verdict``'s.  A straggler found is
told here too (``StragglerReports``), with its stack: never a kill."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import psutil

from supervisor.core.errors import SuperviseError
from supervisor.core.events import Event, EventKind
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.payloads import AlertData, GpuFaultData, ProbeFields, StragglerData
from supervisor.gpu.health import GpuFault
from supervisor.hosts import stacks
from supervisor.hosts.base import StackDumper
from supervisor.hosts.stacks import StackDump, stacks_data
from supervisor.jobs.runner._context import Live, RunnerContext, gpu_summary
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.notify.alerts import Alert
from supervisor.notify.notices import BarStep, Milestones
from supervisor.spec.model import JobSpec
from supervisor.watchdog import Judgement, Straggler, fine_duration


class Alerts:
    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._milestones: dict[int, Milestones] = {}  # by attempt: the phases and ETAs already alerted
        self._sending: set[asyncio.Task[None]] = set()  # alerts on their way (a run's end waits for them)

    def about(self, live: Live) -> notices.Attempt:
        return notices.Attempt(job=self._spec.name, n=live.row.n, gpu=gpu_summary(self._ctx.gpu.latest()),
                               failure=live.failure, stacks=live.stacks.summary() if live.stacks else None)

    async def send(self, live: Live, alert: Alert) -> None:
        if await self._ctx.alerter.send(alert):
            self._journal.record(live.row.n, EventKind.ALERT, alert.title,
                                 AlertData(kind=alert.kind.value, severity=alert.severity.value,
                                           evidence=alert.evidence, next=alert.next_action))

    def send_soon(self, live: Live, alert: Alert) -> None:
        """Sent off the watch loop: a slow endpoint must not delay noticing an exit."""
        self.track(asyncio.create_task(self.send(live, alert), name=f"alert:{alert.key}"))

    def track(self, task: asyncio.Task[None]) -> None:
        """An alert on its way in ``task`` (with what it waits for first): a run's end waits for it."""
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def verdict(self, live: Live, judgement: Judgement, next_action: str) -> None:
        await self.send(live, notices.verdict(self.about(live), judgement, next_action))

    async def end(self, live: Live, judgement: Judgement, next_action: str, gave_up: str | None) -> None:
        """The attempt's end: a verdict and what comes next, or the job given up (``gave_up``: why)."""
        if gave_up is None:
            await self.verdict(live, judgement, next_action)
        else:
            await self.send(live, notices.gave_up(self.about(live), judgement, gave_up))

    async def done(self, live: Live, judgement: Judgement) -> None:
        await self.send(live, notices.done(self.about(live), judgement, live.ended_at() - live.row.started))

    def observed(self, live: Live, events: list[Event]) -> None:
        """Milestones among the events just read: a phase the spec names, a bar's ETA."""
        if not events:
            return
        milestones = self._milestones.setdefault(live.row.n, Milestones(self._spec.alerts))
        elapsed = time.time() - live.row.started
        # What an alert says of the attempt (its GPUs, its failure) is the same for every event of
        # one read: made once for them, not once per redraw of a busy bar.
        about = self.about(live)
        # The watchdog has taken every event of the read by now: its latest bar is the same for each.
        bar = live.watchdog.progress if any(e.kind is EventKind.PROGRESS for e in events) else None
        for event in events:
            due = []
            if event.phase is not None:  # a phase line, or a progress line that implies its phase
                due.append(milestones.phase(about, event.phase, elapsed))
            step = BarStep.of(ProbeFields.of(event).progress, bar) \
                if event.kind is EventKind.PROGRESS else None
            if step is not None:
                due.append(milestones.progress(about, step, elapsed, self._ctx.clock()))
            for alert in due:
                if alert is not None:
                    self.send_soon(live, alert)

    def read_each_step(self, live: Live) -> bool:
        """Whether an alert may come of a progress line that is no stored milestone: a periodic
        ETA, a percent mark, a phase not announced yet (each redraw then goes to ``observed``)."""
        spec = self._spec.alerts
        if spec.eta_every_s is not None or spec.eta_at_percent:
            return True
        if not spec.notify_phases:
            return False
        milestones = self._milestones.get(live.row.n)
        return bool(set(spec.notify_phases) - (milestones.phases_sent if milestones is not None else set()))

    def gpu_fault(self, live: Live, host: str, fault: GpuFault) -> None:
        """A fault on a GPU the attempt uses: recorded and alerted."""
        self._journal.record(live.row.n, EventKind.GPU_FAULT, fault.describe(),
                             GpuFaultData(fault.gpu, fault.kind.value, fault.xid, fault.detail))
        self.send_soon(live, notices.gpu_fault(self.about(live), host, fault))

    async def sent(self) -> None:
        """Wait for the alerts on their way (a run's end is alerted before the runner counts as ended)."""
        pending: Any = set(self._sending)
        if pending:
            await asyncio.wait(pending, timeout=35)


# A straggler the watchdog found, told: which process it is (its pid, host and GPU, as far as
# the daemon can tell), stored as a `straggler` event with its stack when stacks can be taken, and
# alerted like a slow step.  Never a kill: the stall rules judge a rank that stops.
#
# Each report runs off the watch loop (reading processes' environments, a py-spy dump): the log
# is read on meanwhile.

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
