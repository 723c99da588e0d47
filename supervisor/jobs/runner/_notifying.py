"""The runner's alerts and its gate before a kill: what ``notices`` composes is sent here, at the
points the runner reaches (an attempt judged, the job given up or done, a phase reached, a bar
moved), and an unhealthy verdict while it runs goes through the ``KillGate`` (warn, count down,
cancel, hold) before it becomes a kill."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from supervisor.core.errors import SuperviseError
from supervisor.core.events import Event, EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, AlertData, GpuFaultData, ProbeFields, VerdictData
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts import stacks
from supervisor.hosts.base import StackDumper
from supervisor.hosts.stacks import StackDump, stacks_data
from supervisor.jobs.runner._context import Live, Recording, gpu_summary
from supervisor.jobs.runner._gate import KillGate, Step
from supervisor.notify import notices
from supervisor.notify.alerts import Alert
from supervisor.notify.notices import BarStep, Milestones
from supervisor.watchdog import Judgement

_PIDS_FRESH_S = 10.0
# A warning about these says "it may be stuck": the stacks are dumped with it, as before a kill (a
# diverging loss or a GPU fault is not a hang, and its stacks would say nothing).
_STUCK_VERDICTS = frozenset({Verdict.STALLED, Verdict.SILENT, Verdict.HUNG, Verdict.IDLE})


class Notifying(Recording):
    """The half of a job runner that alerts, and decides when an unhealthy attempt is killed."""

    live: Live | None

    def _init_notifying(self) -> None:
        self._held = False  # `supervise hold`: no kill until `release`, for this attempt and the next
        self._gates: dict[int, KillGate] = {}
        self._milestones: dict[int, Milestones] = {}
        self._sending: set[asyncio.Task[None]] = set()

    # ---- alerts --------------------------------------------------------------------------

    def _about(self, live: Live) -> notices.Attempt:
        return notices.Attempt(job=self.spec.name, n=live.row.n, gpu=gpu_summary(self.ctx.gpu.latest()),
                               failure=live.failure, stacks=live.stacks.summary() if live.stacks else None)

    async def _send(self, live: Live, alert: Alert) -> None:
        if await self.ctx.alerter.send(alert):
            self._publish([self._event(live.row.n, EventKind.ALERT, alert.title,
                                       AlertData(kind=alert.kind.value, severity=alert.severity.value,
                                                 evidence=alert.evidence, next=alert.next_action))])

    def _send_soon(self, live: Live, alert: Alert) -> None:
        """Sent off the watch loop: a slow endpoint must not delay noticing an exit."""
        task = asyncio.create_task(self._send(live, alert), name=f"alert:{alert.key}")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _alert(self, live: Live, judgement: Judgement, next_action: str) -> None:
        await self._send(live, notices.verdict(self._about(live), judgement, next_action))

    async def _alert_end(self, live: Live, judgement: Judgement, next_action: str, gave_up: str | None) -> None:
        """The attempt's end: a verdict and what comes next, or the job given up (``gave_up``: why)."""
        if gave_up is None:
            await self._alert(live, judgement, next_action)
        else:
            await self._send(live, notices.gave_up(self._about(live), judgement, gave_up))

    async def _alert_done(self, live: Live, judgement: Judgement) -> None:
        await self._send(live, notices.done(self._about(live), judgement, live.ended_at() - live.row.started))

    def _notify_observed(self, live: Live, events: list[Event]) -> None:
        """Milestones among the events just read: a phase the spec names, a bar's ETA."""
        if not events:
            return
        milestones = self._milestones.setdefault(live.row.n, Milestones(self.spec.alerts))
        elapsed = time.time() - live.row.started
        # What an alert says of the attempt (its GPUs, its failure) is the same for every event of
        # one read: made once for them, not once per redraw of a busy bar.
        about = self._about(live)
        for event in events:
            due = []
            if event.phase is not None:  # a phase line, or a progress line that implies its phase
                due.append(milestones.phase(about, event.phase, elapsed))
            step = BarStep.of(ProbeFields.of(event).progress, live.watchdog.progress) \
                if event.kind is EventKind.PROGRESS else None
            if step is not None:
                due.append(milestones.progress(about, step, elapsed, self.ctx.clock()))
            for alert in due:
                if alert is not None:
                    self._send_soon(live, alert)

    async def _attempt_pids(self, live: Live) -> set[int]:
        """The attempt's processes, looked up at most every ``_PIDS_FRESH_S`` (a scan of the
        process table per GPU sample would cost the loop more than the sample)."""
        now = self.ctx.clock()
        if live.pids_read_at is None or now - live.pids_read_at > _PIDS_FRESH_S:
            live.pids_read_at = now
            live.known_pids |= await self.ctx.host.attempt_pids(live.handle)
        return {live.handle.pid} | live.known_pids

    async def gpus_sampled(self, host: str, sample: GpuSample) -> None:
        """Whether the running attempt's GPUs computed: the watchdog's idle rule reads it."""
        live = self.live
        if live is None or host != self.ctx.host.name:
            return
        ours = await self._attempt_pids(live)
        held: dict[int, int] = {}
        for p in sample.processes:
            if p.pid in ours:
                held[p.gpu_index] = held.get(p.gpu_index, 0) + (p.used_mib or 0)
        if sample.available:  # a host whose GPUs cannot be read says nothing of what the attempt held
            live.gpu_meter.sampled(sample.ts, held)
        if self.spec.gpu.devices != "all":
            devices = {d for d in self.spec.gpu.devices if sample.device(d) is not None}
        else:
            devices = set(held)
        utilisation = [u for d in devices if (device := sample.device(d)) and (u := device.util_pct) is not None]
        if not utilisation:
            return  # not on a GPU, or a board that does not tell
        live.watchdog.gpus_sampled(tuple(sorted(devices)), max(utilisation) > 0)
        live.wake_if_sooner(live.watchdog.next_check_at())

    async def gpu_fault(self, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
        """A fault on one of ``host``'s GPUs: recorded and alerted if the running attempt uses it (a
        process of its tree on that device, or the device named in its spec)."""
        live = self.live
        if live is None or host != self.ctx.host.name:
            return False
        named = self.spec.gpu.devices != "all" and fault.gpu in self.spec.gpu.devices
        if not named and not await self._attempt_pids(live) & device_pids:
            return False
        self._publish([self._event(live.row.n, EventKind.GPU_FAULT, fault.describe(),
                                   GpuFaultData(fault.gpu, fault.kind.value, fault.xid, fault.detail))])
        self._send_soon(live, notices.gpu_fault(self._about(live), host, fault))
        return True

    # ---- the gate before a kill --------------------------------------------------------------

    def _record_verdict(self, live: Live, judgement: Judgement) -> None:
        self._update(live.row.n, verdict=judgement.verdict.value, reason=judgement.reason)
        self._publish([self._event(live.row.n, EventKind.VERDICT, f"{judgement.verdict.value}: {judgement.reason}",
                                   VerdictData(judgement.verdict, judgement.evidence))])


    def _gate(self, live: Live) -> KillGate:
        return self._gates.setdefault(live.row.n, KillGate.of(self.spec.health, self._held))

    def _kill_deadline(self, live: Live) -> float | None:
        return self._gate(live).deadline()

    def _gated(self, live: Live, judgement: Judgement) -> bool:
        """Whether ``judgement`` (the watchdog's, now) kills the attempt now; warns, or says it
        moved again, where the gate says so."""
        gate, now = self._gate(live), self.ctx.clock()
        episode, kill_pending = gate.episode, gate.kill_at is not None
        step = gate.judge(judgement, now)
        where = notices.where(live.watchdog.progress, live.watchdog.phase)
        if step is Step.WARN:
            next_action = gate.next_action(self.spec.name, now)
            self._record_verdict(live, judgement)
            self._set_job(JobState.RUNNING, f"attempt {live.row.n}: {judgement.verdict.value} {where}; {next_action}")
            if judgement.verdict in _STUCK_VERDICTS and isinstance(self.ctx.host, StackDumper):
                self._warn_with_stacks(live, judgement, where, next_action)
            else:
                self._send_soon(live, notices.warning(self._about(live), judgement, where, next_action))
        elif step is Step.RECOVERED and episode is not None:
            pending = kill_pending
            self._update(live.row.n, verdict=None, reason=None)
            self._action(live, f"moving again {where}: {'kill cancelled' if pending else 'warning over'}", ActionData())
            self._set_job(JobState.RUNNING, f"attempt {live.row.n}")
            self._send_soon(live, notices.recovered(self._about(live), episode, where, pending))
        return step is Step.KILL

    def _warn_with_stacks(self, live: Live, judgement: Judgement, where: str, next_action: str) -> None:
        """The warning of a job that may be stuck carries its stacks: dumped first (bounded), then sent,
        off the watch loop.  A kill that comes meanwhile waits for this dump before taking its own."""

        async def dump_then_warn() -> None:
            await self._dump_stacks(live, judgement, "at the warning")
            await self._send(live, notices.warning(self._about(live), judgement, where, next_action))

        task = asyncio.create_task(dump_then_warn(), name=f"warn-stacks:{self.spec.name}.{live.row.n}")
        live.stacks_pending = task
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(lambda done: setattr(live, "stacks_pending", None) if live.stacks_pending is done else None)

    async def _dump_stacks(self, live: Live, judgement: Judgement, when: str) -> None:
        """Every process's Python stack, stored as an event with the verdict; bounded, and never
        in the way of the kill (no py-spy, no permission: one line, and the kill goes on)."""
        pending = live.stacks_pending
        if pending is not None and not pending.done() and pending is not asyncio.current_task():
            # Two py-spy attaching to one process at once: the second is refused.
            await asyncio.wait({pending}, timeout=stacks.PER_PROCESS_S + 30)
        host = self.ctx.host
        if not isinstance(host, StackDumper):
            dump = StackDump((), f"no stacks: not taken on {host.name} (a batch scheduler's host)")
        else:
            try:
                dump = await asyncio.wait_for(host.dump_stacks(live.handle, stacks.PER_PROCESS_S),
                                              stacks.PER_PROCESS_S + 30)
            except (SuperviseError, TimeoutError) as exc:
                dump = StackDump((), f"no stacks: {exc or 'timed out'}")
        live.stacks = dump
        self._publish([self._event(live.row.n, EventKind.STACKS,
                                   f"stacks {when} ({judgement.verdict.value}): {dump.summary()}",
                                   stacks_data(dump))])

    def hold(self) -> str:
        """Postpone any kill of this job until ``release``."""
        self._held = True
        live = self.live
        if live is None:
            return f"{self.spec.name} held: no kill until `supervise release {self.spec.name}`"
        gate = self._gate(live)
        due = gate.deadline()
        gate.hold()
        message = (f"{self.spec.name} held: the kill due in {max(0.0, due - self.ctx.clock()):.0f} s is postponed"
                   if due is not None else f"{self.spec.name} held: no kill") + \
            f" until `supervise release {self.spec.name}`"
        self._action(live, message, ActionData(held=True))
        live.wake.set()
        return message

    def release(self) -> str:
        """Let kills come again; a pending one counts down again from now."""
        self._held = False
        live = self.live
        if live is None:
            return f"{self.spec.name} released"
        gate = self._gate(live)
        gate.release(self.ctx.clock())
        due = gate.deadline()
        message = f"{self.spec.name} released" + (
            f": killing in {max(0.0, due - self.ctx.clock()):.0f} s unless it moves" if due is not None else "")
        self._action(live, message, ActionData(held=False))
        live.wake.set()
        return message

    async def _alerts_sent(self) -> None:
        """Wait for the alerts on their way (a run's end is alerted before the runner counts as ended)."""
        pending: Any = set(self._sending)
        if pending:
            await asyncio.wait(pending, timeout=35)
