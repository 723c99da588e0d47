"""One job's control loop: launch an attempt, watch it, judge it, clean up, relaunch or stop.

Watching an attempt means three things at once: its log is followed and fed through the
probe engine (events are stored with the offset they bring the attempt to, then
published), its exit is awaited (a pidfd: noticed at once, not at the next poll), and the
watchdog is asked for a verdict whenever its own next deadline comes, never on a fixed tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from .alerts import Alert, Alerter
from .bus import EventBus
from .errors import LaunchError, StoreError, SuperviseError
from .events import AttemptState, Event, EventKind, Failure, JobState, ProbeEvent, ProbeKind, Record, Verdict
from .gpu import GpuSample, foreign_processes, wait_for_release
from .hosts.base import (
    ExitStatus,
    Follower,
    Host,
    KillReport,
    LaunchRequest,
    ProcessHandle,
)
from .matching import Matcher, PackDisabled, TailReader
from .pending_writes import PendingWrites
from .policy import RestartPolicy
from .probes import load_packs
from .snapshot import RunnerSnapshot, watching
from .spec import JobSpec
from .store import AttemptRow, Store
from .watchdog import Judgement, ProgressState, Watchdog

log = structlog.get_logger("supervise.runner")

_OFFSET_SAVE_INTERVAL_S = 1.0  # with no events, the resume offset is saved at most this often
# A traceback is complete only when the next line shows it is over; a process that hangs
# right after printing one (a rank died, its peers wait) prints no next line.  After this
# much quiet, an open traceback is taken as complete.
_TRACEBACK_QUIET_S = 1.0
# tqdm leaves its latest redraw unterminated until the next one: a bar stuck at 4/8 would read
# 3/8.  A redraw left alone this long was written whole; its progress is read at once.
_REDRAW_QUIET_S = 0.2
_QUIET_SLACK_S = 0.005  # a timer may fire this much early
_MAX_UNSAVED_EVENTS = 100_000  # kept while the store cannot be written (full disk); oldest dropped beyond
_FINAL_VERDICTS = {Verdict.CRASHED, Verdict.OOM, Verdict.DONE}


class GpuView:
    """What a runner needs of the daemon's GPU sampler."""

    def __init__(self, sample: Callable[[], Any], latest: Callable[[], GpuSample | None]) -> None:
        self.sample = sample  # async () -> GpuSample
        self.latest = latest


@dataclass
class RunnerContext:
    store: Store
    bus: EventBus
    host: Host
    alerter: Alerter
    gpu: GpuView
    clock: Callable[[], float] = time.monotonic
    records_seen: Callable[[str, int], None] | None = None  # (job, records read): the metrics' counter


@dataclass
class _Live:
    """Live handles of the attempt being watched (never saved: the store has the saved state)."""

    row: AttemptRow
    handle: ProcessHandle
    watchdog: Watchdog
    killed_by_us: bool = False
    last_output: float | None = None
    events_seen: int = 0
    failure: Failure | None = None  # the root cause of the failures logged
    known_pids: set[int] = field(default_factory=set)
    exit_status: ExitStatus | None = None
    check_at: float | None = None  # when the watch loop will next ask the watchdog
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    contained: set[str] = field(default_factory=set)  # faults already reported (once each)


class JobRunner:
    def __init__(self, spec: JobSpec, ctx: RunnerContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.policy = RestartPolicy(spec.restart)
        self.live: _Live | None = None
        self.next_relaunch_at: float | None = None
        self._stop_requested = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.error: SuperviseError | None = None  # what ended the loop, if an error did (`start` reports it)
        self._engine_packs = load_packs(spec.probes, spec.probe_files)
        self._writes = PendingWrites(spec.name)
        self._current: _Live | None = None  # the attempt launched or adopted last, until the next

    # -- public ------------------------------------------------------------------------

    def start(self, resume: AttemptRow | None = None) -> None:
        self.task = asyncio.create_task(self._run(resume), name=f"job:{self.spec.name}")

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def stop(self, grace_s: float | None = None) -> KillReport:
        """Stop the job: no more relaunches; TERM the whole tree, wait, KILL."""
        self._stop_requested.set()
        report = KillReport()
        live = self.live
        if live is not None:
            live.killed_by_us = True
            report = await self.ctx.host.kill_tree(live.handle, self.spec.stop_grace_s if grace_s is None else grace_s)
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError, SuperviseError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=30)
        return report

    async def detach(self) -> None:
        """The daemon is shutting down: stop watching, leave the job running for the next daemon."""
        self._writes.close()  # what is not stored yet, the next daemon's recovery redoes
        if self.task is not None:
            # Cancel until it has ended: a cancellation that lands just as an awaited result
            # completes is swallowed (asyncio.wait_for before 3.12, suppress(CancelledError)).
            while not self.task.done():
                self.task.cancel()
                await asyncio.wait({self.task}, timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    # -- the loop ----------------------------------------------------------------------

    async def _run(self, resume: AttemptRow | None) -> None:
        try:
            await self._attempts(resume)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - contained: a live process is never left unsupervised
            try:
                await self._contain(exc)
            except Exception:  # the daemon must outlive any one job's bug
                log.exception("job runner crashed", job=self.spec.name)
        await self._writes.drained()  # the run's end is stored before the runner counts as ended

    async def _attempts(self, resume: AttemptRow | None) -> None:
        # A re-adopted attempt continues the run it belonged to; a fresh `start` opens a new run
        # with a fresh budget.
        previous_fp = self._previous_fingerprint(resume) if resume else None
        run = resume.run if resume else self.ctx.store.next_run_number(self.spec.name)
        run_attempts = resume.run_attempt - 1 if resume else 0
        while True:
            run_attempts += 1
            if resume is not None:
                live = self._adopt(resume)
                resume = None
            else:
                if not await self._prelaunch_gpu_check():
                    return
                live = await self._launch(run)
            self._current = self.live = live
            judgement = await self._watch(live)
            self.live = None
            fingerprint = live.failure.fingerprint if live.failure else None
            if self._stop_requested.is_set():
                # A stop is the user's decision, not a verdict on the job: no crashed/oom label.
                self._update(live.row.n, state=AttemptState.STOPPED, ended=time.time(), action="stopped by user", verdict=None,
                             reason=f"stopped by user; the command {_describe(live.exit_status)}")
                self._action(live, "stopped by user", {})
                self._set_job(JobState.STOPPED, "stopped by user")
                return
            if judgement.verdict is Verdict.DONE:
                await self._end_attempt(live, judgement, "none: job done")
                self._set_job(JobState.DONE, judgement.reason)
                return
            decision = self.policy.decide(judgement.verdict, run_attempts, fingerprint, previous_fp)
            await self._cleanup(live, judgement)
            released = await self._wait_gpu_release(live)
            if not released:
                await self._end_attempt(live, judgement, "give up: GPU memory leaked")
                self._set_job(JobState.FAILED, "GPU memory still held after cleanup: not relaunching")
                return
            action = f"relaunch in {decision.wait_s:.1f}s" if decision.action == "relaunch" else f"give up: {decision.reason}"
            await self._end_attempt(live, judgement, action)
            await self._alert(live, judgement, action)
            if decision.action != "relaunch":
                self._set_job(JobState.FAILED, decision.reason)
                return
            previous_fp = fingerprint
            self._set_job(JobState.BACKOFF, f"{judgement.verdict.value}: {judgement.reason}; relaunching in {decision.wait_s:.0f}s")
            if await self._sleep_unless_stopped(decision.wait_s):
                self._set_job(JobState.STOPPED, "stopped by user during backoff")
                return

    async def _contain(self, exc: Exception) -> None:
        """What ended the loop.  A live process is never left unsupervised: it is watched to
        its exit (and `stop` still reaches it) before the run ends."""
        live = self._current
        if live is not None and live.exit_status is None and await self._alive(live):
            await self._watch_exit_only(live, exc)
        elif isinstance(exc, StoreError):
            # Nothing runs (the store refused a new attempt): the job's end is stored when there is room.
            log.error("job supervision stopped: the store cannot be written", job=self.spec.name, error=str(exc))
            self._set_job(JobState.FAILED, f"the store could not be written ({exc}); free disk space")
        elif isinstance(exc, SuperviseError):
            log.error("job failed", job=self.spec.name, error=str(exc))
            self.error = exc
            self._set_job(JobState.FAILED, str(exc))
        else:  # the daemon must outlive any one job's bug
            log.error("job runner crashed", job=self.spec.name, error=repr(exc), exc_info=exc)
            self._set_job(JobState.FAILED, f"internal error: {exc!r}")

    async def _alive(self, live: _Live) -> bool:
        try:
            return await self.ctx.host.is_alive(live.handle)
        except Exception:  # noqa: BLE001 - contained: a live process is never left unsupervised
            return True  # cannot tell: keep watching, `stop` can still kill it

    async def _watch_exit_only(self, live: _Live, exc: Exception) -> None:
        """Supervision of this attempt failed (``exc``) while its process lives: watch its exit
        only, then end the run (no relaunch: what failed would fail again)."""
        log.error("attempt supervision failed; watching its exit only", job=self.spec.name, attempt=live.row.n,
                  error=repr(exc), exc_info=exc)
        reason = f"supervision failed ({type(exc).__name__}: {exc})"
        self.live = live
        self._action(live, f"{reason}; watching only the process's exit from now on", {"error": repr(exc)})
        self._set_job(JobState.RUNNING, f"attempt {live.row.n}: {reason}; watching its exit only")
        try:
            status = await self.ctx.host.wait_exit(live.handle)
        except SuperviseError as wait_error:
            status = ExitStatus(returncode=None, signal=None)
            reason += f"; its exit could not be awaited ({wait_error})"
        self.live = None
        live.exit_status = status
        stopped = self._stop_requested.is_set()
        self._update(live.row.n, exit_code=status.returncode, exit_signal=status.signal,
                     state=AttemptState.STOPPED if stopped else AttemptState.ENDED, ended=time.time(),
                     action="stopped by user" if stopped else "none: supervision failed",
                     reason=f"{reason}; the command {status.describe()}")
        self._publish([self._event(live.row.n, EventKind.EXITED, f"attempt {live.row.n} {status.describe()}",
                                   {"returncode": status.returncode, "signal": status.signal})])
        if stopped:
            self._set_job(JobState.STOPPED, "stopped by user")
        elif status.returncode == 0:
            self._set_job(JobState.DONE, f"exited 0; {reason}")
        else:
            self._set_job(JobState.FAILED, f"{reason}; the command {status.describe()}")

    def _previous_fingerprint(self, resume: AttemptRow) -> str | None:
        with contextlib.suppress(SuperviseError):
            return self.ctx.store.attempt(self.spec.name, resume.n - 1).fingerprint
        return None

    async def _sleep_unless_stopped(self, seconds: float) -> bool:
        self.next_relaunch_at = time.time() + seconds
        try:
            await asyncio.wait_for(self._stop_requested.wait(), timeout=seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self.next_relaunch_at = None

    def _set_job(self, state: JobState, reason: str) -> None:
        self._writes.submit(lambda: self.ctx.store.set_job_state(self.spec.name, state, reason))

    def _update(self, n: int, **fields: Any) -> None:
        self._writes.submit(lambda: self.ctx.store.update_attempt(self.spec.name, n, **fields))

    # -- launch / adopt ----------------------------------------------------------------

    async def _launch(self, run: int) -> _Live:
        store, spec = self.ctx.store, self.spec
        await self._writes.drained()  # the previous attempt's end is stored before the next is numbered
        n = store.next_attempt_number(spec.name)
        log_path, status_path = await self.ctx.host.log_paths(spec.name, n)
        tag = f"{spec.name}.{n}.{uuid.uuid4().hex[:10]}"
        argv = spec.argv(n)
        workdir = spec.resolved_workdir()
        row = AttemptRow(
            job=spec.name, n=n, tag=tag, host=self.ctx.host.name, argv=argv, workdir=workdir,
            log_path=log_path, status_path=status_path, pid=None, pgid=None, start_time=None,
            started=time.time(), ended=None, state=AttemptState.LAUNCHING, exit_code=None, exit_signal=None,
            log_offset=0, phase=None, progress=None, verdict=None, reason=None, failure=None,
            fingerprint=None, action=None, run=run,
        )
        store.add_attempt(row)  # saved before launch: a crash here leaves a visible 'launching' row
        self._set_job(JobState.RUNNING, f"attempt {n}")
        self._baseline = self._gpu_baseline()
        try:
            request = LaunchRequest(argv=argv, workdir=workdir, env=spec.environment(n), log_path=log_path,
                                    status_path=status_path, tag=tag)
            handle = await self.ctx.host.launch(request)
        except Exception as exc:  # re-raised as a SuperviseError
            # Whatever failed, the attempt ends here: a row left `launching` would be taken for
            # a launch the daemon died in, by the next daemon's recovery.
            error = exc if isinstance(exc, SuperviseError) else LaunchError(f"launch of {argv[0]} failed: {exc!r}")
            self._update(n, state=AttemptState.ENDED, ended=time.time(), verdict=Verdict.CRASHED.value,
                         reason=str(error), action="give up: launch failed")
            raise error from exc
        row.pid, row.pgid, row.start_time, row.state = handle.pid, handle.pgid, handle.start_time, AttemptState.RUNNING
        self._update(n, pid=handle.pid, pgid=handle.pgid, start_time=handle.start_time, state=AttemptState.RUNNING)
        self._publish([self._event(n, EventKind.LAUNCHED, f"attempt {n} launched: pid {handle.pid}",
                                   {"pid": handle.pid, "argv": argv, "log": log_path, "host": self.ctx.host.name})])
        return _Live(row=row, handle=handle, watchdog=Watchdog(spec.health, clock=self.ctx.clock))

    def _adopt(self, row: AttemptRow) -> _Live:
        handle = ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                               tag=row.tag, log_path=row.log_path, status_path=row.status_path)
        self._baseline = self._gpu_baseline()
        live = _Live(row=row, handle=handle, watchdog=Watchdog(self.spec.health, clock=self.ctx.clock))
        self._current = live
        # Replay what was already stored so phase, progress and failure are known again.
        for event in self.ctx.store.events(self.spec.name, attempt=row.n):
            self._note(live, event)
        self._set_job(JobState.RUNNING, f"attempt {row.n} (re-adopted)")
        return live

    def _gpu_baseline(self) -> dict[int, int]:
        sample = self.ctx.gpu.latest()
        if sample is None or not sample.available:
            return {}
        return {d.index: d.used_mib for d in sample.devices}

    async def _prelaunch_gpu_check(self) -> bool:
        gpu = self.spec.gpu
        if gpu.foreign_memory == "ignore":
            return True
        devices = None if gpu.devices == "all" else list(gpu.devices)
        deadline = time.monotonic() + gpu.foreign_wait_s
        while True:
            sample = await self.ctx.gpu.sample()
            if not sample.available:
                return True
            foreign = foreign_processes(sample, devices, set())
            if not foreign:
                return True
            who = ", ".join(f"pid {p.pid} {_cmdline(p.pid)} {p.used_mib or '?'} MiB on GPU {p.gpu_index}" for p in foreign)
            if gpu.foreign_memory == "refuse" or time.monotonic() >= deadline:
                self._set_job(JobState.FAILED, f"GPUs hold memory of other processes: {who}; free them or set gpu.foreign_memory='ignore'")
                return False
            self._set_job(JobState.WAITING, f"waiting for GPUs held by other processes: {who}")
            if await self._sleep_unless_stopped(5.0):
                self._set_job(JobState.STOPPED, "stopped by user while waiting for GPUs")
                return False

    # -- watching ----------------------------------------------------------------------

    async def _watch(self, live: _Live) -> Judgement:
        engine = Matcher(self._engine_packs, live.row.log_offset, live.row.tag)
        follower = self.ctx.host.follow(live.handle.log_path, live.row.log_offset, live.row.log_generation)
        reader = asyncio.create_task(self._read(live, follower, engine), name=f"read:{live.row.tag}")
        exit_task = asyncio.create_task(self.ctx.host.wait_exit(live.handle), name=f"exit:{live.row.tag}")
        reader_reported = False
        try:
            while True:
                timeout = self._time_to_next_check(live)
                live.wake.clear()
                wake = asyncio.create_task(live.wake.wait())
                waiting = {exit_task, wake} | ({reader} if not reader_reported else set())
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                if exit_task in done:
                    return await self._finish(live, follower, reader, engine, exit_task.result())
                if reader in done:
                    # The log cannot be read (removed, unreadable disk): keep watching the process.
                    reader_reported = True
                    error = reader.exception()
                    self._action(live, f"log following stopped ({error}); still watching the process", {})
                judgement = live.watchdog.check()
                # Stalled, silent, or hung after a failure: judged while alive, killed next.
                if judgement.verdict is not Verdict.HEALTHY:
                    self._record_verdict(live, judgement)
                    return judgement
        finally:
            for task in (exit_task, reader):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            engine.close()
            await follower.aclose()

    def snapshot(self) -> RunnerSnapshot:
        """What the runner shows readers (status, metrics) now: a frozen copy, never live state."""
        live = self.live
        if live is None:
            return RunnerSnapshot(job=self.spec.name, attempt=None, next_relaunch_at=self.next_relaunch_at)
        return watching(self.spec.name, live.row.n, live.watchdog, self.ctx.clock(), last_output=live.last_output,
                        known_pids=frozenset(live.known_pids))

    def _time_to_next_check(self, live: _Live) -> float | None:
        at = live.watchdog.next_check_at()
        live.check_at = at
        return None if at is None else max(0.0, at - self.ctx.clock())

    async def _read(self, live: _Live, follower: Follower, engine: Matcher) -> None:
        unsaved: list[Event] = []  # events a failed store write (full disk) could not take yet
        try:
            await self._read_batches(live, follower, engine, unsaved)
        finally:
            if unsaved:  # the store refused the last ones: they are stored when there is room
                events, offset = list(unsaved), engine.resume_offset
                self._writes.submit(lambda: self._save(live, events, offset, force=True))

    async def _read_batches(self, live: _Live, follower: Follower, engine: Matcher, unsaved: list[Event]) -> None:
        last_save = 0.0
        disk_warned = False
        redraws = TailReader(follower, engine)
        async for batch in _batches_or_quiet(follower, lambda: self._quiet_wait(live, engine, redraws)):
            if batch is None:  # the log has been quiet: complete what it left open
                quiet_for = self.ctx.clock() - live.watchdog.last_output_at
                if engine.has_open_traceback and quiet_for >= _TRACEBACK_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(live, self._matched(live, await engine.flush()), output=False))
                if redraws.pending() and quiet_for >= _REDRAW_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(live, await redraws.read(), output=False))
                # Rules may have come due already (these events date from the last output): look now.
                live.wake.set()
            else:
                if self.ctx.records_seen is not None:
                    self.ctx.records_seen(self.spec.name, len(batch))
                live.row.log_generation = batch[-1].generation  # a batch never spans a restart of the log
                matched = self._matched(live, await engine.feed(batch))
                unsaved.extend(self._observe(live, matched, records=len(batch)))
            force = time.monotonic() - last_save > _OFFSET_SAVE_INTERVAL_S
            try:
                if self._save(live, unsaved, engine.resume_offset, force=force):
                    last_save = time.monotonic()
                unsaved.clear()
                disk_warned = False
            except StoreError as exc:
                # Keep following and judging; store what is pending with the next batch.
                if not disk_warned:
                    log.error("cannot store events; will retry with the next batch", job=self.spec.name, error=str(exc))
                    disk_warned = True
                del unsaved[:-_MAX_UNSAVED_EVENTS]

    def _matched(self, live: _Live, matched: Any) -> list[ProbeEvent]:
        """The events matched; each pack the matcher disabled (too slow, or raising) is reported."""
        for disabled in matched.disabled:
            self._pack_disabled(live, disabled)
        return matched.events

    def _pack_disabled(self, live: _Live, disabled: PackDisabled) -> None:
        message = f"probe pack '{disabled.pack}' disabled for attempt {live.row.n}: {disabled.reason}"
        self._publish([self._event(live.row.n, EventKind.ALERT, message,
                                   {"pack": disabled.pack, "reason": disabled.reason})])

    def _quiet_wait(self, live: _Live, engine: Matcher, redraws: TailReader) -> float | None:
        """How long the log may stay quiet before something it left open is completed: an open
        traceback, an unterminated progress redraw.  None: nothing is open."""
        waits = []
        if engine.has_open_traceback:
            waits.append(_TRACEBACK_QUIET_S)
        if redraws.pending():
            waits.append(_REDRAW_QUIET_S)
        if not waits:
            return None
        quiet_for = self.ctx.clock() - live.watchdog.last_output_at
        return max(0.0, min(waits) - quiet_for)

    def _observe(self, live: _Live, probe_events: list[ProbeEvent], *, output: bool = True,
                 records: int = 0) -> list[Event]:
        """Feed the watchdog (output seen, each event) and return the events to store.
        ``records``: how many records brought these events.  ``output=False``: events completed
        later from records already seen, which date from the last output, not from now."""
        if output:
            now = self.ctx.clock()
            heartbeats = sum(1 for pe in probe_events if pe.kind is ProbeKind.INFO and pe.fields.get("heartbeat"))
            live.watchdog.output_seen(now, heartbeats_only=0 < records <= heartbeats)
            live.last_output = time.time()
        else:
            now = live.watchdog.last_output_at
        events = [self._from_probe(live.row.n, pe) for pe in probe_events]
        for event in events:
            event.generation = live.row.log_generation
            self._note(live, event, now)
        return events

    def _save(self, live: _Live, events: list[Event], offset: int, *, force: bool) -> bool:
        """Store the events with the offset they bring the attempt to (one transaction), publish them."""
        if not events and not force:
            return False
        state = live.watchdog.state()  # one look per batch: what to store, and when to look again
        fields: dict[str, Any] = {"phase": state.phase.value if state.phase else None,
                                  "log_generation": live.row.log_generation}
        if state.progress is not None:
            fields["progress"] = _progress_dict(state.progress)
        if state.failure is not None:
            fields["failure"] = state.failure
            fields["fingerprint"] = state.failure.fingerprint
        if events:
            stored = self.ctx.store.record_events(events, offset=offset, attempt_fields=fields)
            self.ctx.bus.publish([e for e in stored if e.id is not None])
        else:
            self.ctx.store.update_attempt(self.spec.name, live.row.n, log_offset=offset, **fields)
        live.row.log_offset = offset
        # Wake the watch loop only if the watchdog now wants to look earlier than planned:
        # progress only pushes deadlines later, and a wake-up per batch is costly on busy logs.
        at = state.next_check_at
        if at is not None and (live.check_at is None or at < live.check_at):
            live.wake.set()
        return True

    def _note(self, live: _Live, event: Event, now: float | None = None) -> None:
        try:
            live.watchdog.observe(event, now)
        except Exception as exc:  # noqa: BLE001 - contained: a live process is never left unsupervised
            self._contained(live, f"the watchdog could not take an event of probe {event.probe}", exc)
        if event.failure is not None:
            live.failure = live.watchdog.failure  # the root cause, not the latest echo of it

    def _contained(self, live: _Live, what: str, exc: Exception) -> None:
        """A fault kept from ending supervision: logged, and stored as an event once per kind."""
        key = f"{what}:{type(exc).__name__}"
        if key in live.contained:
            return
        live.contained.add(key)
        log.error("fault contained; supervision goes on", job=self.spec.name, what=what, error=repr(exc))
        self._action(live, f"{what} ({type(exc).__name__}: {exc}); it was skipped, supervision goes on",
                     {"error": repr(exc)})

    async def _finish(self, live: _Live, follower: Follower, reader: asyncio.Task[None], engine: Matcher,
                      status: ExitStatus) -> Judgement:
        # Drain the log to its end before judging: the traceback is written just before exit.
        follower.finish()
        # A log that cannot be read to its end must not stop the attempt from being judged.
        try:
            await asyncio.wait_for(reader, timeout=30)
        except Exception:  # noqa: BLE001, S110 - timed out, or the reader failed (said when it did)
            pass
        except asyncio.CancelledError:
            # The reader was cancelled: judge anyway.  This task being cancelled (the daemon
            # detaching at shutdown) must go through, or the runner would relaunch regardless.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        try:
            flushed = self._matched(live, await asyncio.wait_for(engine.flush(), timeout=10))
        except Exception:  # noqa: BLE001 - a matcher stuck on a costly chunk must not hold up the verdict
            flushed = []
        events, offset = self._observe(live, flushed), follower.offset
        self._writes.submit(lambda: self._save(live, events, offset, force=True))
        live.exit_status = status
        self._update(live.row.n, exit_code=status.returncode, exit_signal=status.signal)
        self._publish([self._event(live.row.n, EventKind.EXITED, f"attempt {live.row.n} {status.describe()}",
                                   {"returncode": status.returncode, "signal": status.signal})])
        judgement = live.watchdog.exited(status.returncode, status.signal, live.killed_by_us)
        if not self._stop_requested.is_set():  # a user's stop is not a verdict on the job
            self._record_verdict(live, judgement)
        return judgement

    def _record_verdict(self, live: _Live, judgement: Judgement) -> None:
        self._update(live.row.n, verdict=judgement.verdict.value, reason=judgement.reason)
        self._publish([self._event(live.row.n, EventKind.VERDICT, f"{judgement.verdict.value}: {judgement.reason}",
                                   {"verdict": judgement.verdict.value, **_jsonable(judgement.evidence)})])

    # -- after an attempt --------------------------------------------------------------

    async def _cleanup(self, live: _Live, judgement: Judgement) -> None:
        if judgement.verdict in _FINAL_VERDICTS and not await self.ctx.host.attempt_pids(live.handle):
            return
        live.killed_by_us = True
        report = await self.ctx.host.kill_tree(live.handle, self.spec.stop_grace_s)
        live.known_pids |= {pid for pid, _ in report.terminated + report.killed + report.survivors}
        if live.exit_status is None:  # killed while alive (stalled, silent): record how it ended
            status = await self.ctx.host.exit_status(live.handle)
            if status is not None:
                live.exit_status = status
                self._update(live.row.n, exit_code=status.returncode, exit_signal=status.signal)
        self._action(live, f"killed the process tree: {report.summary()}",
                     {"terminated": report.terminated, "killed": report.killed, "survivors": report.survivors,
                      "reparented": report.reparented})

    async def _wait_gpu_release(self, live: _Live) -> bool:
        sample = self.ctx.gpu.latest()
        if sample is None or not sample.available:
            return True
        gpu = self.spec.gpu
        devices = None if gpu.devices == "all" else list(gpu.devices)
        # Every pid the attempt ever showed: NVML may still list a process that psutil no longer sees.
        known = {live.handle.pid} | live.known_pids | await self.ctx.host.attempt_pids(live.handle)

        async def wait() -> Any:
            return await wait_for_release(self.ctx.gpu.sample, devices, self._baseline, lambda: known,
                                          tolerance_mib=gpu.release_tolerance_mib, timeout_s=gpu.release_timeout_s)

        result = await wait()
        if not result.released and await self.ctx.host.attempt_pids(live.handle):
            # Last resort: anything still alive that carries the attempt's tag is killed outright.
            await self.ctx.host.kill_tree(live.handle, 0)
            result = await wait()
        self._action(live, f"GPU memory {'released' if result.released else 'STILL HELD'} after {result.waited_s:.1f}s",
                     {"released": result.released, "waited_s": result.waited_s})
        if not result.released:
            await self._alert(live, Judgement(Verdict.LEAKED, "GPU memory leaked", {}), "not relaunching: GPU memory still held")
        return result.released

    async def _end_attempt(self, live: _Live, judgement: Judgement, action: str) -> None:
        self._update(live.row.n, state=AttemptState.ENDED, ended=time.time(), action=action,
                     verdict=judgement.verdict.value, reason=judgement.reason)
        self._action(live, action, {})

    async def _alert(self, live: _Live, judgement: Judgement, next_action: str) -> None:
        sample = self.ctx.gpu.latest()
        gpu_text = _gpu_summary(sample)
        failure = live.failure
        evidence = judgement.reason
        if failure is not None and failure.line:
            evidence += f" | {failure.line} (fingerprint {failure.fingerprint})"
        alert = Alert(job=self.spec.name, attempt=live.row.n, title=f"{self.spec.name}: attempt {live.row.n} {judgement.verdict.value}",
                      what=judgement.verdict.value, evidence=evidence, gpu=gpu_text, next_action=next_action,
                      key=f"{self.spec.name}:{live.row.n}:{judgement.verdict.value}")
        if await self.ctx.alerter.send(alert):
            self._publish([self._event(live.row.n, EventKind.ALERT, alert.title, {"evidence": evidence, "next": next_action})])

    # -- events ------------------------------------------------------------------------

    def _action(self, live: _Live, message: str, data: dict[str, Any]) -> None:
        self._publish([self._event(live.row.n, EventKind.ACTION, message, _jsonable(data))])

    def _event(self, n: int, kind: EventKind, message: str, data: dict[str, Any]) -> Event:
        return Event(job=self.spec.name, attempt=n, kind=kind, message=message, data=data)

    def _from_probe(self, n: int, pe: ProbeEvent) -> Event:
        return Event(job=self.spec.name, attempt=n, kind=EventKind(pe.kind.value), message=pe.line,
                     probe=pe.probe, phase=pe.phase, offset=pe.offset, data=_jsonable(pe.fields), failure=pe.failure)

    def _publish(self, events: list[Event]) -> None:
        self._writes.submit(lambda: self.ctx.bus.publish(self.ctx.store.record_events(events)))


async def _batches_or_quiet(
    follower: Follower, quiet_wait: Callable[[], float | None]
) -> AsyncIterator[list[Record] | None]:
    """The follower's batches, and None each time the log has been quiet for as long as
    ``quiet_wait()`` says (None: wait for the next batch however long it takes)."""
    batches = aiter(follower.records())
    pending: asyncio.Future[list[Record]] | None = None
    try:
        while True:
            timeout = quiet_wait()
            if pending is None and timeout is None:
                try:
                    batch = await anext(batches)
                except StopAsyncIteration:
                    return
                yield batch
                continue
            if pending is None:
                # Waited on as a task, so that a timeout leaves the follower untouched.
                pending = asyncio.ensure_future(anext(batches))
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                batch = task.result()
            except StopAsyncIteration:
                return
            yield batch
    finally:
        if pending is not None:
            pending.cancel()


def _describe(status: ExitStatus | None) -> str:
    return status.describe() if status is not None else "was still running when watching stopped"


def _progress_dict(progress: ProgressState) -> dict[str, Any]:
    return {"probe": progress.probe, "bar": progress.bar, "done": progress.done, "total": progress.total,
            "rate_s_per_it": progress.rate, "eta_s": progress.eta_s}


def _gpu_summary(sample: GpuSample | None) -> str:
    if sample is None or not sample.available:
        return "GPU: not monitored" if sample is None else f"GPU: {sample.reason}"
    return "; ".join(f"GPU{d.index} {d.used_mib}/{d.total_mib} MiB" for d in sample.devices)


def _cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:80]
    except psutil.Error:
        return "(gone)"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
