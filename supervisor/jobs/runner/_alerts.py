"""A runner's alerts, composed into the runner and given to the watch: what ``notices`` composes is
sent here, at the points the runner reaches (an attempt judged, the job given up or done, a phase
reached, a bar moved).  Alerts only say: what is decided of a verdict, and every kill, is
``_verdict``'s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from supervisor.core.events import Event, EventKind, Verdict
from supervisor.core.payloads import AlertData, GpuFaultData, ProbeFields
from supervisor.gpu.health import GpuFault
from supervisor.jobs.runner._context import Live, RunnerContext, gpu_summary
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.notify.alerts import Alert
from supervisor.notify.notices import BarStep, Milestones
from supervisor.spec.model import JobSpec
from supervisor.watchdog import Judgement

# A warning about these says "it may be stuck": the stacks are dumped with it, as before a kill (a
# diverging loss or a GPU fault is not a hang, and its stacks would say nothing).
_STUCK_VERDICTS = frozenset({Verdict.STALLED, Verdict.SILENT, Verdict.HUNG, Verdict.IDLE})


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
