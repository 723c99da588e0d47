"""One job's control loop: launch an attempt (``_launch``) or adopt one after a daemon restart
(``_adopting``), watch it (``AttemptWatch``), end it (``_ending``), ask the restart policy, and
relaunch with backoff or stop.  What it works with is composed, not inherited: the journal it
records through, the alerts and kill gate, the GPU gate before a launch, the paces.  No exception
inside the loop ends supervision of a live process: it is contained and the process watched to its
exit (``_contain``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable

import structlog

from supervisor.core.actions import ActionKind, AttemptAction
from supervisor.core.errors import StoreError, SuperviseError
from supervisor.core.events import JobState, Verdict
from supervisor.core.payloads import ActionData
from supervisor.core.tasks import set_within
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts import stacks
from supervisor.hosts.base import ExitStatus, Host, KillReport, ProgramFinder, StackDumper
from supervisor.hosts.stacks import StackDump
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.policy import Policy, RestartPolicy
from supervisor.jobs.quarantine import UNREACHABLE as UNREACHABLE_STRIKE
from supervisor.jobs.runner import _launch as start_point
from supervisor.jobs.runner._adopting import Anchor, Readoption
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import CatchUp, Live, RunnerContext, cancel_until_done
from supervisor.jobs.runner._ending import Ending, gpu_baseline
from supervisor.jobs.runner._journal import JobScope, Journal, Scope, StartNews
from supervisor.jobs.runner._launch import Paces, StartPoint, launch
from supervisor.jobs.runner._verdict import Verdicts
from supervisor.jobs.runner._waits import UNREACHABLE, GpuGate, KeepAway, wait_for_after, wait_for_host
from supervisor.jobs.runner._watching import AttemptWatch, wait_while_queued
from supervisor.jobs.snapshot import RunnerSnapshot, watching
from supervisor.probes import load_packs
from supervisor.spec.model import JobSpec
from supervisor.spec.tables import GpuSpec
from supervisor.store.database import AttemptRow
from supervisor.watchdog import Judgement

log = structlog.get_logger("supervise.runner")

LAUNCH_PACK = "launch"  # probes/launch.toml
# probes/general.toml: lines any program prints (its counters, its closing sentence, a one-line refusal,
# the shell's reports); every log is read with it, whatever packs the spec names.
GENERAL_PACK = "general"


class JobRunner:
    """A job's runner.  A shard's runner is the same loop given its coordinator's scope, news and
    policy (sharding.py)."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, scope: Scope | None = None, *,
                 news: StartNews | None = None, policy: Policy | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.scope: Scope = scope or JobScope(ctx.recorder, spec.name)  # a shard's runner: its coordinator's (sharding.py)
        self.policy: Policy = policy or RestartPolicy(spec.restart)
        self.news = news or StartNews()  # what `start` awaits: the first attempt running, or a wait said at once
        self._live: Live | None = None
        self._watching_one = asyncio.Event()  # set while ``live`` is an attempt (what a stop awaits)
        self.next_relaunch_at: float | None = None
        self._stop_requested = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.error: SuperviseError | None = None  # what ended the loop, if an error did (`start` reports it)
        # The wrapper's own lines (a command not found) are read whatever packs the spec names.
        self._engine_packs = load_packs(None if spec.probes is None else [*spec.probes, LAUNCH_PACK, GENERAL_PACK], spec.probe_files)
        self._writes = PendingWrites(spec.name)
        self._current: Live | None = None  # the attempt launched or adopted last, until the next
        self.unreachable_since: float | None = None  # its host stopped answering (wall time), until it answers
        # Its collaborators, each given what it needs.
        self.journal = Journal(spec.name, ctx.recorder, self._writes, self.scope, self.news)
        self.alerts = Alerts(spec, ctx, self.journal)
        self.verdicts = Verdicts(spec, ctx, self.journal, self.alerts)  # the kill gate, holds, every kill
        self.paces = Paces(spec, ctx, self._writes)  # each bar's pace: earlier attempts' for the watchdog, this one's kept
        self.gpu_gate = GpuGate(spec, ctx, self.journal, self._stop_requested)
        self.keep_away = KeepAway(spec, ctx, self.journal, self._stop_requested)  # quarantined GPUs and hosts
        self.ending = Ending(spec, ctx, self.journal, self.alerts, self.verdicts)
        self._readoption = Readoption(spec, ctx, self.journal, self.alerts, self.paces)

    def start(self, resume: AttemptRow | None = None) -> None:
        self.task = asyncio.create_task(self._run(resume), name=f"job:{self.spec.name}")

    @property
    def live(self) -> Live | None:
        """The attempt being watched now, if any."""
        return self._live

    @live.setter
    def live(self, live: Live | None) -> None:
        self._live = live
        if live is None:
            self._watching_one.clear()
        else:
            self._watching_one.set()

    @property
    def shard(self) -> int | None:
        """Stored with each attempt: the shard's index, for a shard's runner."""
        return self.scope.shard

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def stop(self, grace_s: float | None = None) -> KillReport:
        """Stop the job: no more relaunches; TERM the whole tree, wait, KILL."""
        self._stop_requested.set()
        report = KillReport()
        # Nothing reaches the process of an unreachable host: the stop ends the wait for it, and says so.
        live = None if self.unreachable_since is not None else self.live or await self._launched_or_ended()
        if live is not None:
            report = await self.verdicts.kill(live, self.spec.stop_grace_s if grace_s is None else grace_s)
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError, SuperviseError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=30)
        return report

    async def _launched_or_ended(self, timeout_s: float = 30.0) -> Live | None:
        """A stop that comes while an attempt is being launched (a `restart` just before, say) waits
        for its process to exist, to kill it: a stop is never lost between launch and watch.  The
        loop itself sees the stop everywhere else (backoff, GPU and `after` waits) and ends."""
        if self.live is None and self.task is not None and not self.task.done():
            watching = asyncio.ensure_future(self._watching_one.wait())
            try:
                await asyncio.wait({watching, self.task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watching.cancel()
        return self.live

    async def detach(self) -> None:
        """The daemon is shutting down: stop watching, leave the job running for the next daemon."""
        self._writes.close()  # what is not stored yet, the next daemon's recovery redoes
        if self.task is not None:
            await cancel_until_done(self.task)

    async def _run(self, resume: AttemptRow | None) -> None:
        while True:
            try:
                await self._attempts(resume)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - contained: a live process is never left unsupervised
                try:
                    if self._unreachable(exc):
                        resume = await self._wait_until_reachable(exc)
                        if resume is not None:
                            continue  # the host answers again: the same attempt is re-adopted
                    else:
                        await self._contain(exc)
                except Exception:  # the daemon must outlive any one job's bug
                    log.exception("job runner crashed", job=self.spec.name)
            break
        await self.alerts.sent()
        await self._writes.drained()  # the run's end is stored before the runner counts as ended

    async def _attempts(self, resume: AttemptRow | None) -> None:
        run, run_attempts, previous_fp = self.scope.run_so_far(resume)
        if resume is None and (left := self.scope.rest_of_backoff(self.policy)) > 0:
            self.journal.set_job(JobState.BACKOFF, f"relaunching in {left:.0f}s (the backoff the daemon restarted in)")
            if await self._sleep_unless_stopped(left):
                self.journal.set_job(JobState.STOPPED, "stopped by user during backoff")
                return
        if resume is None and self.spec.after and not await wait_for_after(self.spec.after, self.ctx.store, self.journal,
                                                                             self.ctx.alerter, self._stop_requested):
            return
        start: StartPoint | None = None  # the next launch's checkpoint and parameters, once a relaunch decided them
        while True:
            run_attempts += 1
            catch_up = None  # a re-adopted attempt's: what its watch catches up on
            if resume is not None:
                live, anchor = self._adopt(resume)
                resume = None
                catch_up = await self._readoption.catch_up(live, anchor)
            else:
                launching = await self.keep_away.spec_for_launch()
                if launching is None or not await self.gpu_gate.clear():
                    return
                if start is None:
                    start = await start_point.first(self.spec, self.ctx)
                async with self.scope.numbering():
                    live = await launch(run, self.shard, spec=launching, ctx=self.ctx, journal=self.journal,
                                        news=self.news, paces=self.paces, start=start)
            self._current = self.live = live
            finder = asyncio.create_task(learn_program_pid(self.ctx.host, live), name=f"program:{self.spec.name}")
            try:
                judgement = await self._watch(live, catch_up)
            finally:
                finder.cancel()
                if live.notify is not None:  # closed by the watch, unless it never began
                    live.notify.close()
            self.live = None
            fingerprint = live.failure.fingerprint if live.failure else None
            if self._stop_requested.is_set():
                # A stop is the user's decision, not a verdict on the job: no crashed/oom label.
                await self.ending.record_stopped(live)
                self.journal.set_job(JobState.STOPPED, "stopped by user")
                return
            await self.keep_away.attempt_ended(judgement.verdict.value, live.row.host)
            if judgement.verdict is Verdict.DONE:
                await self.ending.record(live, judgement, AttemptAction.none("job done"))
                self.journal.set_job(JobState.DONE, judgement.reason)
                await self.alerts.done(live, judgement)
                return
            start = await start_point.after(self.spec, self.ctx, live, judgement.verdict)
            # From an older checkpoint or with other parameters, a repeated failure proves nothing yet.
            decision = self.policy.decide(judgement.verdict, run_attempts, fingerprint,
                                          None if start.new_ground else previous_fp,
                                          live.failure.kind if live.failure else None)
            if (report := await self.ending.kill_what_is_left(live, judgement)) is not None:
                live.procs.known_pids |= {pid for pid, _ in report.terminated + report.killed + report.survivors}
            released = await self.ending.gpus_released(live)
            if not released:
                await self.ending.record(live, judgement, AttemptAction.give_up("GPU memory leaked"))
                self.journal.set_job(JobState.FAILED, "GPU memory still held after cleanup: not relaunching")
                return
            relaunch = decision.action is ActionKind.RELAUNCH
            action = AttemptAction.relaunch(decision.wait_s) if relaunch else AttemptAction.give_up(decision.reason)
            await self.ending.record(live, judgement, action)
            next_action = action.text + (f"; {start.describe()}" if relaunch and start.describe() else "")
            next_action += self.keep_away.move_note() if relaunch else ""
            await self.alerts.end(live, judgement, next_action, None if relaunch else decision.reason)
            if not relaunch:
                self.journal.set_job(JobState.FAILED, decision.reason)
                return
            if judgement.verdict is Verdict.PREEMPTED:
                run_attempts -= 1  # the scheduler's doing: it spends none of the failure budget
            else:
                previous_fp = fingerprint
            self.journal.set_job(JobState.BACKOFF,
                                 f"{judgement.verdict.value}: {judgement.reason}; relaunching in {decision.wait_s:.0f}s")
            if await self._sleep_unless_stopped(decision.wait_s):
                self.journal.set_job(JobState.STOPPED, "stopped by user during backoff")
                return

    def _unreachable(self, exc: Exception) -> bool:
        """The attempt's host cannot be reached, and nothing says its process ended."""
        live = self._current
        return isinstance(exc, UNREACHABLE) and live is not None and live.exit_status is None

    async def _wait_until_reachable(self, exc: Exception) -> AttemptRow | None:
        """The host of a live attempt cannot be reached (``exc``): the job reads ``unreachable``
        until the host answers; then the attempt is returned to be re-adopted as after a daemon
        restart (its log from the stored offset, its exit from the exit file if it ended
        meanwhile).  None: stopped by the user meanwhile."""
        live = self._current
        assert live is not None
        self.live, self.unreachable_since = None, time.time()
        await self.keep_away.attempt_ended(UNREACHABLE_STRIKE, live.row.host)
        if not await wait_for_host(self.ctx.host, live, exc, self.journal, self.alerts, self._stop_requested):
            self.unreachable_since = None
            return None
        await self._writes.drained()  # the re-adoption reads what this attempt stored
        return self.ctx.store.attempt(self.spec.name, live.row.n)

    async def _contain(self, exc: Exception) -> None:
        """What ended the loop.  A live process is never left unsupervised: it is watched to
        its exit (and `stop` still reaches it) before the run ends."""
        live = self._current
        if live is not None and live.exit_status is None and await self._alive(live):
            await self._watch_exit_only(live, exc)
        elif isinstance(exc, StoreError):
            # Nothing runs (the store refused a new attempt): the job's end is stored when there is room.
            log.error("job supervision stopped: the store cannot be written", job=self.spec.name, error=str(exc))
            self.journal.set_job(JobState.FAILED, f"the store could not be written ({exc}); free disk space")
        elif isinstance(exc, SuperviseError):
            log.error("job failed", job=self.spec.name, error=str(exc))
            self.error = exc
            self.journal.set_job(JobState.FAILED, str(exc))
        else:  # the daemon must outlive any one job's bug
            log.error("job runner crashed", job=self.spec.name, error=repr(exc), exc_info=exc)
            self.journal.set_job(JobState.FAILED, f"internal error: {exc!r}")

    async def _alive(self, live: Live) -> bool:
        try:
            return await self.ctx.host.is_alive(live.handle)
        except Exception:  # noqa: BLE001 - contained: a live process is never left unsupervised
            return True  # cannot tell: keep watching, `stop` can still kill it

    async def _watch_exit_only(self, live: Live, exc: Exception) -> None:
        """Supervision of this attempt failed (``exc``) while its process lives: watch its exit
        only, then end the run (no relaunch: what failed would fail again)."""
        log.error("attempt supervision failed; watching its exit only", job=self.spec.name, attempt=live.row.n,
                  error=repr(exc), exc_info=exc)
        reason = f"supervision failed ({type(exc).__name__}: {exc})"
        self.live = live
        self.journal.action(live.row.n, f"{reason}; watching only the process's exit from now on",
                            ActionData(error=repr(exc)))
        self.journal.set_job(JobState.RUNNING, f"attempt {live.row.n}: {reason}; watching its exit only")
        try:
            status = await self.ctx.host.wait_exit(live.handle)
        except SuperviseError as wait_error:
            status = ExitStatus(returncode=None, signal=None)
            reason += f"; its exit could not be awaited ({wait_error})"
        self.live = None
        stopped = self._stop_requested.is_set()
        await self.ending.record_unwatched(live, status, reason, stopped=stopped)
        if stopped:
            self.journal.set_job(JobState.STOPPED, "stopped by user")
        elif status.returncode == 0:
            self.journal.set_job(JobState.DONE, f"exited 0; {reason}")
        else:
            self.journal.set_job(JobState.FAILED, f"{reason}; the command {status.describe()}")

    async def _sleep_unless_stopped(self, seconds: float) -> bool:
        self.next_relaunch_at = time.time() + seconds
        try:
            return await set_within(self._stop_requested, seconds)
        finally:
            self.next_relaunch_at = None

    def _adopt(self, row: AttemptRow) -> tuple[Live, Anchor]:
        live, anchor = self._readoption.live(row, self.unreachable_since, gpu_baseline(self.ctx))
        self._current = live  # from here on, a host that cannot be reached leaves it waiting, unjudged
        self.unreachable_since = None  # the host answers again, if that was the wait
        return live, anchor

    async def _watch(self, live: Live, catch_up: CatchUp | None) -> Judgement:
        # A batch scheduler's queue: no output to judge yet.
        await wait_while_queued(self.ctx.host, live, self._stop_requested, self.journal)
        watch = AttemptWatch(live, spec=self.spec, ctx=self.ctx, journal=self.journal, alerts=self.alerts,
                             verdicts=self.verdicts, paces=self.paces, packs=self._engine_packs, stopped=self._stop_requested,
                             catch_up=catch_up)
        return await watch.run()

    def snapshot(self) -> RunnerSnapshot:
        """What the runner shows readers (status, metrics) now: a frozen copy, never live state."""
        live = self.live
        if live is None:
            return RunnerSnapshot(job=self.spec.name, attempt=None, next_relaunch_at=self.next_relaunch_at, shard=self.shard)
        seen = watching(self.spec.name, live.row.n, live.watchdog, self.ctx.clock(), last_output=live.last_output,
                        known_pids=frozenset(live.known_pids), program_pid=live.program_pid,
                        status_line=live.status_line)
        return seen if self.shard is None else dataclasses.replace(seen, shard=self.shard)

    async def stacks_now(self) -> StackDump | None:
        """`supervise stack`: the running attempt's stacks now (None: none is running)."""
        live, host = self.live, self.ctx.host
        if live is None:
            return None
        if not isinstance(host, StackDumper):
            return StackDump((), f"no stacks: not taken on {host.name} (a batch scheduler's host)")
        return await host.dump_stacks(live.handle, stacks.PER_PROCESS_S)

    # ---- what the jobs' owner and the daemon's GPU sampler call -----------------------------

    @property
    def gpu_wait(self) -> str | None:
        """While the launch waits for GPUs other processes hold: for what, in one line."""
        return self.gpu_gate.waiting or self.keep_away.waiting

    def hold(self) -> str:
        """Postpone any kill of this job until ``release``."""
        return self.verdicts.hold(self.live)

    def release(self) -> str:
        """Let kills come again; a pending one counts down again from now."""
        return self.verdicts.release(self.live)

    async def gpus_sampled(self, host: str, sample: GpuSample) -> None:
        """Whether the running attempt's GPUs computed: the watchdog's idle rule reads it."""
        live = self.live
        if live is not None and host == self.ctx.host.name:
            await gpus_sampled(self.ctx.host, self.spec.gpu, live, sample, self.ctx.clock)

    async def gpu_fault(self, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
        """A fault on one of ``host``'s GPUs: recorded and alerted if the running attempt uses it (a
        process of its tree on that device, or the device named in its spec)."""
        live = self.live
        if live is None or host != self.ctx.host.name:
            return False
        named = self.spec.gpu.devices != "all" and fault.gpu in self.spec.gpu.devices
        if not named and not await attempt_pids(self.ctx.host, live, self.ctx.clock) & device_pids:
            return False
        self.alerts.gpu_fault(live, host, fault)
        return True

# ---- the attempt's processes, as the runner sees them (it owns ``Live.procs``) ------------
# The program an attempt runs, as opposed to the wrapper shell that launched it (and stays to
# record its exit): the pid `status` shows and a user would `kill`, `py-spy` or `nvidia-smi` for.
# Learned once, shortly after the launch (or a re-adoption), from the host's process table.

_TRIES = 40
_EVERY_S = 0.25  # the wrapper starts its child within milliseconds; a loaded box may take longer


async def learn_program_pid(host: object, live: Live) -> None:
    """Sets ``live.program_pid`` once the wrapper's child is seen (gives up after ~10 s, or when the
    attempt ends first, or on a host that cannot tell)."""
    if not isinstance(host, ProgramFinder):
        return
    for _ in range(_TRIES):
        if live.exit_status is not None:
            return
        try:
            pid = await host.program_pid(live.handle)
        except (SuperviseError, OSError):
            pid = None
        if pid is not None:
            live.procs.program_pid = pid
            return
        await asyncio.sleep(_EVERY_S)


# What the running attempt does on its GPUs, from the daemon's samples: the memory and
# GPU-seconds it used (its meter), and whether its GPUs computed (the watchdog's idle rule).

_PIDS_FRESH_S = 10.0


async def attempt_pids(host: Host, live: Live, clock: Callable[[], float]) -> set[int]:
    """The attempt's processes, looked up at most every ``_PIDS_FRESH_S`` (a scan of the
    process table per GPU sample would cost the loop more than the sample)."""
    now = clock()
    if live.procs.pids_read_at is None or now - live.procs.pids_read_at > _PIDS_FRESH_S:
        live.procs.pids_read_at = now
        live.procs.known_pids |= await host.attempt_pids(live.handle)
    return {live.handle.pid} | live.known_pids


async def gpus_sampled(host: Host, gpu: GpuSpec, live: Live, sample: GpuSample, clock: Callable[[], float]) -> None:
    """What the attempt held of ``sample`` (its meter), and whether its GPUs computed (its watchdog)."""
    ours = await attempt_pids(host, live, clock)
    held: dict[int, int] = {}
    for p in sample.processes:
        if p.pid in ours:
            held[p.gpu_index] = held.get(p.gpu_index, 0) + (p.used_mib or 0)
    if sample.available:  # a host whose GPUs cannot be read says nothing of what the attempt held
        live.gpu_meter.sampled(sample.ts, held)
    if gpu.devices != "all":
        devices = {d for d in gpu.devices if sample.device(d) is not None}
    else:
        devices = set(held)
    utilisation = [u for d in devices if (device := sample.device(d)) and (u := device.util_pct) is not None]
    if not utilisation:
        return  # not on a GPU, or a board that does not tell
    live.watchdog.gpus_sampled(tuple(sorted(devices)), max(utilisation) > 0)
    live.wake_if_sooner(live.watchdog.next_check_at())
