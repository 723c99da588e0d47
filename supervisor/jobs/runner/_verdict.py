"""A runner's verdicts while its attempt runs, and its kills: each verdict recorded, and an
unhealthy one goes through the ``KillGate`` (warn, count down, cancel, hold) before it becomes a
kill; the stacks that go with a warning or a kill are dumped here, and every kill of an attempt
(the gate's, a stop's, the disk's) is made here (``Verdicts.kill``).  ``Alerts`` says; this decides
and kills.  It owns the attempt's ``Kill`` state (whether it killed it, the stacks it dumped).

The gate, between an unhealthy verdict and a kill: ``health.action`` (``hung_action`` and
``diverge_action`` for those two verdicts) and a hold by hand.

- ``kill``: the kill comes at once (unless held);
- ``warn``: never a kill, a warning only (the way to trust a new rule on a long run);
- ``warn_then_kill``: a warning, and the kill ``kill_after_s`` later unless the attempt moves
  meanwhile (progress makes the watchdog healthy again, which cancels it).

A hold (``supervise hold``) postpones any kill until ``release``, from which the countdown
starts again.  The gate is pure: ``Verdicts`` gives it the clock and does the alerting and the killing.

What is taken beside the stacks before a kill (the flight recorder, nvidia-smi -q) is at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import structlog

from supervisor.core.errors import SuperviseError
from supervisor.core.events import EventKind, JobState, Verdict
from supervisor.core.host_url import is_local
from supervisor.core.payloads import ActionData, VerdictData
from supervisor.gpu import smi_report
from supervisor.hosts import flight_recorder, stacks
from supervisor.hosts.base import KillReport, StackDumper
from supervisor.hosts.stacks import StackDump, stacks_data
from supervisor.jobs.forewarn import forewarn as send_first_signal
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.spec.model import JobSpec
from supervisor.spec.tables import HealthSpec
from supervisor.store.attempt_writes import AttemptUpdate
from supervisor.watchdog import Judgement

# A warning about these says "it may be stuck": the stacks are dumped with it, as before a kill (a
# diverging loss or a GPU fault is not a hang, and its stacks would say nothing).
_STUCK_VERDICTS = frozenset({Verdict.STALLED, Verdict.SILENT, Verdict.HUNG, Verdict.IDLE})


class Step(StrEnum):
    NOTHING = "nothing"
    KILL = "kill"  # kill now
    WARN = "warn"  # a new unhealthy episode, not killed now: say so (and when the kill comes, if one does)
    RECOVERED = "recovered"  # healthy again after a warning: say so (a pending kill is cancelled)


@dataclass
class KillGate:
    action: str
    kill_after_s: float
    held: bool = False
    episode: Judgement | None = None  # the unhealthy verdict warned about, until it is healthy again
    kill_at: float | None = None  # clock time of the pending kill
    by_verdict: dict[Verdict, str] = field(default_factory=dict)  # verdicts with an action of their own

    @classmethod
    def of(cls, health: HealthSpec, held: bool = False) -> KillGate:
        own = {v: health.action_for(v) for v in (Verdict.HUNG, Verdict.DIVERGED, Verdict.IDLE)}
        # max_runtime is a limit, not a suspicion: health.action = "warn" must not let it run on.
        own[Verdict.TIMEOUT] = "kill"
        return cls(health.action, health.kill_after_s, held, by_verdict=own)

    @property
    def episode_action(self) -> str:
        """The action that applies to the episode under way (``action`` when none is)."""
        return self.action if self.episode is None else self.by_verdict.get(self.episode.verdict, self.action)

    @property
    def delay_s(self) -> float:
        """How long after a warning the kill comes: at once, never, or after ``kill_after_s``."""
        return {"kill": 0.0, "warn": math.inf}.get(self.episode_action, self.kill_after_s)

    def judge(self, judgement: Judgement, now: float) -> Step:
        if judgement.verdict is Verdict.HEALTHY:
            if self.episode is None:
                return Step.NOTHING
            self.episode = self.kill_at = None
            return Step.RECOVERED
        if self.episode is None:
            self.episode = judgement
            if math.isfinite(self.delay_s):
                self.kill_at = now + self.delay_s
            if self.delay_s == 0 and not self.held:
                return Step.KILL
            return Step.WARN
        return Step.KILL if self.due(now) else Step.NOTHING

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def deadline(self) -> float | None:
        """When the pending kill comes (None: none pending, or held)."""
        return None if self.held else self.kill_at

    def hold(self) -> None:
        self.held = True

    def release(self, now: float) -> None:
        """The countdown starts again from now."""
        self.held = False
        if self.kill_at is not None:
            self.kill_at = now + self.delay_s

    def next_action(self, job: str, now: float) -> str:
        """What the warning says comes next."""
        if self.held:
            return f"nothing while held: `supervise release {job}` lets a kill come"
        if self.kill_at is None:
            name = {Verdict.HUNG: "hung_action", Verdict.DIVERGED: "diverge_action", Verdict.IDLE: "idle_action"}.get(
                self.episode.verdict if self.episode is not None else Verdict.HEALTHY, "action")
            return f"nothing: health.{name} is \"warn\", it is never killed for this"
        return f"killing in {max(0.0, self.kill_at - now):.0f} s unless it moves"


class Verdicts:
    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, alerts: Alerts) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts
        self._held = False  # `supervise hold`: no kill until `release`, for this attempt and the next
        self._gates: dict[int, KillGate] = {}  # by attempt

    def record_verdict(self, live: Live, judgement: Judgement) -> None:
        self._journal.update(live.row.n, AttemptUpdate(verdict=judgement.verdict, reason=judgement.reason))
        self._journal.record(live.row.n, EventKind.VERDICT,
                             f"{judgement.verdict.value}: {judgement.reason}",
                             VerdictData(judgement.verdict, judgement.evidence.to_json()))

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
        alerts = self._alerts
        if step is Step.WARN:
            next_action = gate.next_action(self._spec.name, now)
            self.record_verdict(live, judgement)
            self._journal.set_job(JobState.RUNNING,
                                  f"attempt {live.row.n}: {judgement.verdict.value} {where}; {next_action}")
            if judgement.verdict in _STUCK_VERDICTS and isinstance(self._ctx.host, StackDumper):
                self._warn_with_stacks(live, judgement, where, next_action)
            else:
                alerts.send_soon(live, notices.warning(alerts.about(live), judgement, where, next_action))
        elif step is Step.RECOVERED and episode is not None:
            pending = kill_pending
            self._journal.update(live.row.n, AttemptUpdate(verdict=None, reason=None))
            self._journal.action(live.row.n, f"moving again {where}: {'kill cancelled' if pending else 'warning over'}",
                                 ActionData())
            self._journal.set_job(JobState.RUNNING, f"attempt {live.row.n}")
            alerts.send_soon(live, notices.recovered(alerts.about(live), episode, where, pending))
        return step is Step.KILL

    def _warn_with_stacks(self, live: Live, judgement: Judgement, where: str, next_action: str) -> None:
        """The warning of a job that may be stuck carries its stacks: dumped first (bounded), then sent,
        off the watch loop.  A kill that comes meanwhile waits for this dump before taking its own."""
        alerts = self._alerts

        async def dump_then_warn() -> None:
            await self.dump_stacks(live, judgement, "at the warning")
            await alerts.send(live, notices.warning(alerts.about(live), judgement, where, next_action))

        task = asyncio.create_task(dump_then_warn(), name=f"warn-stacks:{self._spec.name}.{live.row.n}")
        kill = live.kill
        kill.stacks_pending = task
        alerts.track(task)

        def dumped(done: asyncio.Task[None]) -> None:
            if kill.stacks_pending is done:
                kill.stacks_pending = None

        task.add_done_callback(dumped)

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
                dump = await taken_with(self._ctx, live, taking)
            except (SuperviseError, TimeoutError) as exc:
                dump = StackDump((), f"no stacks: {exc or 'timed out'}")
        live.kill.stacks = dump
        self._journal.record(live.row.n, EventKind.STACKS,
                             f"stacks {when} ({judgement.verdict.value}): {dump.summary()}",
                             stacks_data(dump))

    async def kill(self, live: Live, grace_s: float, *, forewarn: bool = True) -> KillReport:
        """Kill the attempt's tree (TERM, ``grace_s``, KILL), after the spec's first signal and its
        wait unless ``forewarn`` is False (a program that ended on its own has no checkpoint left to
        write).  Its exit is then no verdict of the watchdog's (killed by us)."""
        live.kill.killed_by_us = True
        host = self._ctx.host
        if forewarn:
            done = await send_first_signal(self._spec, host, live.handle)
            if done is not None:
                self._journal.action(live.row.n, done.message, done.data)
        return await host.kill_tree(live.handle, grace_s)

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


# What is taken beside the stacks at a hang verdict, before the kill: a torch distributed job's
# flight recorder (hosts/flight_recorder.py: set up at launch, ``prepare``) and ``nvidia-smi -q`` where the
# daemon sees GPUs (gpu/smi_report.py).  Both on this machine's attempts only, each bounded within
# the stacks' own bound: nothing here holds the kill back longer than the stacks already may.

log = structlog.get_logger("supervise.runner")


def wanted(spec: JobSpec, argv: list[str]) -> bool:
    """Whether the attempt gets a flight recorder folder: a local job whose command launches torch
    distributed ranks (``flight_recorder = "auto"``), or any local job that says ``"on"``."""
    if not is_local(spec.host) or spec.flight_recorder == "off":
        return False
    return spec.flight_recorder == "on" or flight_recorder.runs_torch_distributed(argv)


def prepare(spec: JobSpec, argv: list[str], log_path: str) -> dict[str, str]:
    """Before the launch (in a thread: it makes a folder): the flight recorder's environment."""
    if not wanted(spec, argv):
        return {}
    folder = flight_recorder.folder_for(log_path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return flight_recorder.environment(folder, spec.env)


def _gpus_seen(ctx: RunnerContext) -> bool:
    sample = ctx.gpu.latest()
    return sample is not None and sample.available and bool(sample.devices)


async def taken_with(ctx: RunnerContext, live: Live, stacks: asyncio.Future[StackDump] | asyncio.Task[StackDump]) -> StackDump:
    """``stacks`` (under way) with the flight recorder's dumps and nvidia-smi -q beside it, taken
    at the same time."""
    local = is_local(live.row.host)
    folder = flight_recorder.folder_for(live.row.log_path)
    recorded = flight_recorder.collect(folder) if local else _nothing()
    smi = (smi_report.take(Path(live.row.log_path + ".nvidia-smi.txt"))
           if local and _gpus_seen(ctx) else _said(""))
    try:
        record, gpu_report = await asyncio.gather(recorded, smi)
    except Exception as exc:  # noqa: BLE001 - never in the way of the stacks, nor of the kill after them
        log.warning("flight recorder or nvidia-smi -q not taken", job=live.row.job, error=repr(exc))
        record, gpu_report = flight_recorder.FlightRecord(f"flight recorder: not read ({exc!r})"[:300]), ""
    dump = await stacks
    if record is None and not gpu_report:
        return dump
    return dataclasses.replace(dump, flight_recorder=record.summary if record else "",
                               dumps=record.dumps if record else (), gpu_report=gpu_report)


async def _nothing() -> flight_recorder.FlightRecord | None:
    return None


async def _said(text: str) -> str:
    return text
