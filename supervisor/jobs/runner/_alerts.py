"""A runner's alerts and its gate before a kill, composed into the runner and given to the watch:
what ``notices`` composes is sent here, at the points the runner reaches (an attempt judged, the
job given up or done, a phase reached, a bar moved), each verdict is recorded here, and an
unhealthy verdict while the attempt runs goes through the ``KillGate`` (warn, count down, cancel,
hold) before it becomes a kill; the stacks that go with a warning or a kill are dumped here."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from supervisor.core.errors import SuperviseError
from supervisor.core.events import Event, EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, AlertData, GpuFaultData, ProbeFields, VerdictData
from supervisor.gpu.health import GpuFault
from supervisor.hosts import stacks
from supervisor.hosts.base import StackDumper
from supervisor.hosts.stacks import StackDump, stacks_data
from supervisor.jobs.runner import _forensics as forensics
from supervisor.jobs.runner._context import Live, RunnerContext, gpu_summary
from supervisor.jobs.runner._gate import KillGate, Step
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.notify.alerts import Alert
from supervisor.notify.notices import BarStep, Milestones
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import AttemptUpdate
from supervisor.watchdog import Judgement

# A warning about these says "it may be stuck": the stacks are dumped with it, as before a kill (a
# diverging loss or a GPU fault is not a hang, and its stacks would say nothing).
_STUCK_VERDICTS = frozenset({Verdict.STALLED, Verdict.SILENT, Verdict.HUNG, Verdict.IDLE})


class Alerts:
    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._held = False  # `supervise hold`: no kill until `release`, for this attempt and the next
        self._gates: dict[int, KillGate] = {}  # by attempt
        self._milestones: dict[int, Milestones] = {}  # by attempt: the phases and ETAs already alerted
        self._sending: set[asyncio.Task[None]] = set()  # alerts on their way (a run's end waits for them)

    # ---- alerts --------------------------------------------------------------------------

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

    # ---- verdicts, and the gate before a kill ----------------------------------------------

    def record_verdict(self, live: Live, judgement: Judgement) -> None:
        self._journal.update(live.row.n, AttemptUpdate(verdict=judgement.verdict, reason=judgement.reason))
        self._journal.record(live.row.n, EventKind.VERDICT,
                             f"{judgement.verdict.value}: {judgement.reason}",
                             VerdictData(judgement.verdict, judgement.evidence))

    def _gate(self, live: Live) -> KillGate:
        return self._gates.setdefault(live.row.n, KillGate.of(self._spec.health, self._held))

    def kill_deadline(self, live: Live) -> float | None:
        return self._gate(live).deadline()

    def gated(self, live: Live, judgement: Judgement) -> bool:
        """Whether ``judgement`` (the watchdog's, now) kills the attempt now; warns, or says it
        moved again, where the gate says so."""
        gate, now = self._gate(live), self._ctx.clock()
        episode, kill_pending = gate.episode, gate.kill_at is not None
        step = gate.judge(judgement, now)
        where = notices.where(live.watchdog.progress, live.watchdog.phase)
        if step is Step.WARN:
            next_action = gate.next_action(self._spec.name, now)
            self.record_verdict(live, judgement)
            self._journal.set_job(JobState.RUNNING,
                                  f"attempt {live.row.n}: {judgement.verdict.value} {where}; {next_action}")
            if judgement.verdict in _STUCK_VERDICTS and isinstance(self._ctx.host, StackDumper):
                self._warn_with_stacks(live, judgement, where, next_action)
            else:
                self.send_soon(live, notices.warning(self.about(live), judgement, where, next_action))
        elif step is Step.RECOVERED and episode is not None:
            pending = kill_pending
            self._journal.update(live.row.n, AttemptUpdate(verdict=None, reason=None))
            self._journal.action(live.row.n, f"moving again {where}: {'kill cancelled' if pending else 'warning over'}",
                                 ActionData())
            self._journal.set_job(JobState.RUNNING, f"attempt {live.row.n}")
            self.send_soon(live, notices.recovered(self.about(live), episode, where, pending))
        return step is Step.KILL

    def _warn_with_stacks(self, live: Live, judgement: Judgement, where: str, next_action: str) -> None:
        """The warning of a job that may be stuck carries its stacks: dumped first (bounded), then sent,
        off the watch loop.  A kill that comes meanwhile waits for this dump before taking its own."""

        async def dump_then_warn() -> None:
            await self.dump_stacks(live, judgement, "at the warning")
            await self.send(live, notices.warning(self.about(live), judgement, where, next_action))

        task = asyncio.create_task(dump_then_warn(), name=f"warn-stacks:{self._spec.name}.{live.row.n}")
        live.stacks_pending = task
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(lambda done: setattr(live, "stacks_pending", None) if live.stacks_pending is done else None)

    async def dump_stacks(self, live: Live, judgement: Judgement, when: str) -> None:
        """Every process's Python stack, stored as an event with the verdict; bounded, and never
        in the way of the kill (no py-spy, no permission: one line, and the kill goes on)."""
        pending = live.stacks_pending
        if pending is not None and not pending.done() and pending is not asyncio.current_task():
            # Two py-spy attaching to one process at once: the second is refused.
            await asyncio.wait({pending}, timeout=stacks.PER_PROCESS_S + 30)
        host = self._ctx.host
        if not isinstance(host, StackDumper):
            dump = StackDump((), f"no stacks: not taken on {host.name} (a batch scheduler's host)")
        else:
            taking = asyncio.ensure_future(asyncio.wait_for(host.dump_stacks(live.handle, stacks.PER_PROCESS_S),
                                                            stacks.PER_PROCESS_S + 30))
            try:
                # The flight recorder and nvidia-smi -q are taken meanwhile, each bounded well within this.
                dump = await forensics.taken_with(self._ctx, live, taking)
            except (SuperviseError, TimeoutError) as exc:
                dump = StackDump((), f"no stacks: {exc or 'timed out'}")
        live.stacks = dump
        self._journal.record(live.row.n, EventKind.STACKS,
                             f"stacks {when} ({judgement.verdict.value}): {dump.summary()}",
                             stacks_data(dump))

    @property
    def held(self) -> bool:
        """Whether kills are held now (`supervise hold`, or a disk hold)."""
        return self._held

    def hold(self, live: Live | None) -> str:
        """Postpone any kill of this job (``live``: its attempt running now, if any) until ``release``."""
        self._held = True
        job = self._spec.name
        if live is None:
            return f"{job} held: no kill until `supervise release {job}`"
        gate = self._gate(live)
        due = gate.deadline()
        gate.hold()
        message = (f"{job} held: the kill due in {max(0.0, due - self._ctx.clock()):.0f} s is postponed"
                   if due is not None else f"{job} held: no kill") + f" until `supervise release {job}`"
        self._journal.action(live.row.n, message, ActionData(held=True))
        live.wake.set()
        return message

    def release(self, live: Live | None) -> str:
        """Let kills come again; a pending one counts down again from now."""
        self._held = False
        job = self._spec.name
        if live is None:
            return f"{job} released"
        gate = self._gate(live)
        gate.release(self._ctx.clock())
        due = gate.deadline()
        message = f"{job} released" + (
            f": killing in {max(0.0, due - self._ctx.clock()):.0f} s unless it moves" if due is not None else "")
        self._journal.action(live.row.n, message, ActionData(held=False))
        live.wake.set()
        return message
