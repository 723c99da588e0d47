"""Watching one attempt: its log followed and matched (off the loop), events stored with the
offset they bring the attempt to and then published, its exit awaited (a pidfd: noticed at
once), and the watchdog asked for a verdict whenever its own next deadline comes, never on a
fixed tick."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from supervisor.core.errors import StoreError
from supervisor.core.events import Event, EventKind, ProbeEvent, ProbeKind, Record
from supervisor.core.payloads import ActionData, AlertData, ExitedData, SlowStep
from supervisor.core.tasks import cancel_and_wait
from supervisor.hosts import kernel_log
from supervisor.hosts.base import ExitStatus, Follower
from supervisor.jobs.matching import Matched, Matcher, PackDisabled, TailReader
from supervisor.jobs.runner._context import Live, bar_progress
from supervisor.jobs.runner._drain import drain
from supervisor.jobs.runner._notifying import Notifying
from supervisor.jobs.runner._pacing import Paces
from supervisor.jobs.runner._queued import scheduler_judgement, wait_while_queued
from supervisor.notify import notices
from supervisor.store.arrivals import ArrivalWriter, marks_path
from supervisor.watchdog import Judgement

log = structlog.get_logger("supervise.runner")

_OFFSET_SAVE_INTERVAL_S = 1.0  # with no events, the resume offset (and bars' latest lines) saved at most this often
# A traceback is complete only when the next line shows it is over; a process that hangs
# right after printing one (a rank died, its peers wait) prints no next line.  After this
# much quiet, an open traceback is taken as complete.
_TRACEBACK_QUIET_S = 1.0
# tqdm leaves its latest redraw unterminated until the next one: a bar stuck at 4/8 would read
# 3/8.  A redraw left alone this long was written whole; its progress is read at once.
_REDRAW_QUIET_S = 0.2
_QUIET_SLACK_S = 0.005  # a timer may fire this much early
_SIGKILL = 9
# Events kept while the store cannot take them (a full disk; another process holding its lock),
# tried again this often even when the log is quiet.  Beyond the bound, reading waits for the store
# (the log keeps the rest, the stored offset says where to go on): none dropped.
_MAX_UNSAVED_EVENTS = 100_000
_UNSAVED_RETRY_S = 1.0
# Records matched, judged and stored per step of the reader: a step holds the loop for about
# 50 us a record (the watchdog, milestones, notices), so ~10 ms at most.
_RECORDS_PER_STEP = 256


class Watching(Notifying):
    """The half of a job runner that watches the attempt it launched or adopted."""

    live: Live | None
    paces: Paces
    _stop_requested: asyncio.Event
    _engine_packs: Any

    def _report_slow(self, live: Live) -> None:
        """A step well over its history, once per bar and step: alerted (never a kill), and stored."""
        for slow in self.paces.new_slow_steps(live):
            self._action(live, f"slow {slow.where}: {slow.judgement.reason}",
                         ActionData(slow=SlowStep.from_json(slow.judgement.evidence)))
            self._send_soon(live, notices.slow(self._about(live), slow.judgement, slow.where))

    async def _watch(self, live: Live) -> Judgement:
        # A batch scheduler's queue: no output to judge yet.
        await wait_while_queued(self.ctx.host, live, self._stop_requested, self.spec.name, self._set_job, self._action)
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
                    live.catch_up_until = None
                    error = reader.exception()
                    self._action(live, f"log following stopped ({error}); still watching the process", ActionData())
                if live.catch_up_until is not None:
                    if self.ctx.clock() < live.catch_up_until:
                        continue  # not judged on its stored past while its backlog is unread
                    live.catch_up_until = None
                judgement = live.watchdog.check()
                self._report_slow(live)
                # Stalled, silent, or hung after a failure: judged while alive, killed next
                # (or warned about first: health.action, a hold).
                if self._gated(live, judgement):
                    self._record_verdict(live, judgement)
                    return judgement
        finally:
            self.paces.store(live)
            for task in (exit_task, reader):
                await cancel_and_wait(task)
            engine.close()
            await follower.aclose()

    def _time_to_next_check(self, live: Live) -> float | None:
        if live.catch_up_until is not None:  # the reader wakes the loop once the backlog is read
            return max(0.0, live.catch_up_until - self.ctx.clock())
        if live.judge_at_once:  # re-adopted: a deadline that passed while no daemon watched is due now
            live.judge_at_once = False
            return 0.0
        at = live.watchdog.next_check_at()
        live.check_at = at
        kill_at = self._kill_deadline(live)
        at = kill_at if at is None else at if kill_at is None else min(at, kill_at)
        return None if at is None else max(0.0, at - self.ctx.clock())

    async def _read(self, live: Live, follower: Follower, engine: Matcher) -> None:
        unsaved: list[Event] = []  # events a failed store write (full disk) could not take yet
        try:
            await self._read_batches(live, follower, engine, unsaved)
        finally:
            if unsaved:  # the store refused the last ones: they are stored when there is room
                events, offset = list(unsaved), engine.resume_offset
                self._writes.submit(lambda: self._save(live, events, offset, force=True))

    async def _read_batches(self, live: Live, follower: Follower, engine: Matcher, unsaved: list[Event]) -> None:
        redraws = TailReader(follower, engine)
        root = self.ctx.arrivals
        arrivals = None if root is None else ArrivalWriter(marks_path(root, self.spec.name, live.row.n))
        try:
            await self._read_each(live, follower, engine, unsaved, redraws, arrivals)
        finally:
            if arrivals is not None:
                arrivals.close()

    async def _read_each(self, live: Live, follower: Follower, engine: Matcher, unsaved: list[Event],
                         redraws: TailReader, arrivals: ArrivalWriter | None) -> None:
        last_save = 0.0
        disk_warned = False

        def quiet_wait() -> float | None:
            return quiet_timeout(self._quiet_wait(live, engine, redraws), latest_pending=live.stored_progress.pending(),
                                 since_save=time.monotonic() - last_save, refused=disk_warned, unsaved=bool(unsaved))

        async for batch in _batches_or_quiet(follower, quiet_wait):
            if batch is None:  # the log has been quiet: complete what it left open
                quiet_for = self.ctx.clock() - live.watchdog.last_output_at
                if engine.has_open_traceback and quiet_for >= _TRACEBACK_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(live, self._matched(live, await engine.flush()), output=False))
                if redraws.pending() and quiet_for >= _REDRAW_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(live, await redraws.read(), output=False))
                # Rules may have come due already (these events date from the last output): look now.
                live.wake.set()
                self._caught_up(live, follower, quiet=True)
                last_save, disk_warned = await self._store_read(live, engine, unsaved, last_save, disk_warned)
                continue
            # A backlog comes in reads of up to a MiB; taken whole, its events held the loop for
            # seconds (every `status` waited behind eight of them).  Taken a step at a time, the
            # loop's work per step stays short, and other tasks run between steps.
            if arrivals is not None:  # when the read was made, not when each step of it was taken
                arrivals.arrived(batch[-1].generation, batch[-1].end, self._arrived_at(live, batch[-1]))
            for step in _steps(batch):
                if self.ctx.records_seen is not None:
                    self.ctx.records_seen(self.spec.name, len(step))
                live.row.log_generation = step[-1].generation  # a batch never spans a restart of the log
                matched = self._matched(live, await engine.feed(step))
                unsaved.extend(self._observe(live, matched, records=len(step), last=step[-1]))
                self._caught_up(live, follower, quiet=False)
                last_save, disk_warned = await self._store_read(live, engine, unsaved, last_save, disk_warned)

    async def _store_read(self, live: Live, engine: Matcher, unsaved: list[Event], last_save: float,
                          disk_warned: bool) -> tuple[float, bool]:
        """Store what the log brought with the offset it brings the attempt to; returns when it
        was last saved and whether the store's refusal has been logged."""
        force = time.monotonic() - last_save >= _OFFSET_SAVE_INTERVAL_S - _QUIET_SLACK_S
        try:
            if self._writes.now(self._save, live, unsaved, engine.resume_offset, force=force):
                last_save = time.monotonic()
            unsaved.clear()
            return last_save, False
        except StoreError as exc:
            # Keep following and judging; store what is pending with the next batch (or in a second).
            if not disk_warned:
                log.error("cannot store events; will retry with the next batch", job=self.spec.name, error=str(exc))
            while len(unsaved) >= _MAX_UNSAVED_EVENTS:  # bounded: read no further until the store takes them
                await asyncio.sleep(_UNSAVED_RETRY_S)
                with contextlib.suppress(StoreError):
                    self._writes.now(self._save, live, unsaved, engine.resume_offset, force=True)
                    unsaved.clear()
            return last_save, True

    @staticmethod
    def _arrived_at(live: Live, last: Record) -> float:
        """When a batch ending with ``last`` arrived: now, or when a backlog's line was written."""
        backlog = live.backlog
        if backlog is not None and backlog.covers(last.offset, last.generation):
            return backlog.wall_at(last.offset)
        return time.time()

    @staticmethod
    def _caught_up(live: Live, follower: Follower, *, quiet: bool) -> None:
        """A re-adopted attempt's backlog is read once the follower has passed its end, or the log
        has gone quiet (its unterminated tail is read then): judge it now."""
        if live.catch_up_until is None:
            return
        if quiet or live.backlog is None or follower.offset >= live.backlog.end_offset:
            live.catch_up_until = None
            live.wake.set()

    def _matched(self, live: Live, matched: Matched) -> list[ProbeEvent]:
        """The events matched; each pack the matcher disabled (too slow, or raising) is reported."""
        for disabled in matched.disabled:
            self._pack_disabled(live, disabled)
        return matched.events

    def _pack_disabled(self, live: Live, disabled: PackDisabled) -> None:
        message = f"probe pack '{disabled.pack}' disabled for attempt {live.row.n}: {disabled.reason}"
        self._publish([self._event(live.row.n, EventKind.ALERT, message,
                                   AlertData(pack=disabled.pack, reason=disabled.reason))])

    def _quiet_wait(self, live: Live, engine: Matcher, redraws: TailReader) -> float | None:
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

    def _observe(self, live: Live, probe_events: list[ProbeEvent], *, output: bool = True,
                 records: int = 0, last: Record | None = None) -> list[Event]:
        """Feed the watchdog (output seen, each event) and return the events to store: all but
        the progress redraws between a bar's milestones (store/milestones.py; ``_save`` adds
        each bar's latest line), decided here, once per event, so that a write the store refused
        is tried again with the same events.
        ``records``: how many records brought these events, ``last`` the last of them.
        ``output=False``: events completed later from records already seen, which date from the
        last output, not from now.  Records written while the daemon was down date from then."""
        backlog = live.backlog if output else None
        wall = time.time()
        if backlog is not None and last is not None and backlog.covers(last.offset, last.generation):
            wall = backlog.wall_at(last.offset)
        elif backlog is not None:
            live.backlog = None  # read past what was written while no daemon watched
        if output:
            now = self._clock_at(wall)
            heartbeats = sum(1 for pe in probe_events if pe.kind is ProbeKind.INFO and pe.fields.get("heartbeat"))
            live.watchdog.output_seen(now, heartbeats_only=0 < records <= heartbeats)
            live.last_output = wall
        else:
            now = live.watchdog.last_output_at
        events = [self._from_probe(live.row.n, pe) for pe in probe_events]
        for event in events:
            event.generation = live.row.log_generation
            at = now
            if backlog is not None and event.offset is not None and backlog.covers(event.offset, event.generation):
                event.ts = backlog.wall_at(event.offset)  # stored with when it was written, not read
                at = self._clock_at(event.ts)
            self._note(live, event, at)
        self._notify_observed(live, events)
        admitted = []
        for event in events:
            live.stored_progress.latest_only = live.event_cap.reached  # past the cap: each bar's latest, in place
            if live.event_cap.admits(event, kept=live.stored_progress.keep(event, event.ts)):
                admitted.append(event)
        notice = live.event_cap.notice()
        if notice is not None:
            self._action(live, notice, ActionData(events_per_attempt=live.event_cap.limit))
        return admitted

    def _clock_at(self, wall: float) -> float:
        """A wall-clock time on the watchdog's clock."""
        return self.ctx.clock() - (time.time() - wall)

    def _save(self, live: Live, events: list[Event], offset: int, *, force: bool) -> bool:
        """Store the events with the offset they bring the attempt to (one transaction), publish them."""
        if not events and not force:
            # A bar's latest line alone is stored with the offset at most every _OFFSET_SAVE_INTERVAL_S
            # (the reader wakes for it when the log goes quiet), not by a transaction for each read
            # of a busy bar (with the watchdog's state looked up for it, a quarter of the loop's
            # samples at 8 x 1000 lines/s).  A daemon killed meanwhile resumes from the offset
            # stored with the row, and reads those redraws again.
            return False
        latest, replaced = live.stored_progress.to_save()  # each bar's latest line, in place of the one before
        state = live.watchdog.state()  # one look per batch: what to store, and when to look again
        fields: dict[str, Any] = {"phase": state.phase.value if state.phase else None,
                                  "log_generation": live.row.log_generation}
        if state.progress is not None:
            fields["progress"] = bar_progress(state.progress)
        if state.failure is not None:
            fields["failure"] = state.failure
            fields["fingerprint"] = state.failure.fingerprint
        if events or latest:
            # Milestones only are published: a bar's latest line stands for its end until the next
            # write replaces it, so that a follower of the bus (events -f, the page) is not sent each one.
            self.ctx.recorder.events(events, unpublished=latest, offset=offset, attempt_fields=fields, replaced=replaced)
            live.stored_progress.saved()
        else:
            self.ctx.store.update_attempt(self.spec.name, live.row.n, log_offset=offset, **fields)
        live.row.log_offset = offset
        # Wake the watch loop only if the watchdog now wants to look earlier than planned:
        # progress only pushes deadlines later, and a wake-up per batch is costly on busy logs.
        live.wake_if_sooner(state.next_check_at)
        return True

    def _note(self, live: Live, event: Event, now: float | None = None) -> None:
        try:
            live.watchdog.observe(event, now)
        except Exception as exc:  # noqa: BLE001 - contained: a live process is never left unsupervised
            self._contained(live, f"the watchdog could not take an event of probe {event.probe}", exc)
        if event.failure is not None:
            live.failure = live.watchdog.failure  # the root cause, not the latest echo of it

    def _contained(self, live: Live, what: str, exc: Exception) -> None:
        """A fault kept from ending supervision: logged, and stored as an event once per kind."""
        key = f"{what}:{type(exc).__name__}"
        if key in live.contained:
            return
        live.contained.add(key)
        log.error("fault contained; supervision goes on", job=self.spec.name, what=what, error=repr(exc))
        self._action(live, f"{what} ({type(exc).__name__}: {exc}); it was skipped, supervision goes on",
                     ActionData(error=repr(exc)))

    async def _finish(self, live: Live, follower: Follower, reader: asyncio.Task[None], engine: Matcher,
                      status: ExitStatus) -> Judgement:
        # Drain the log to its end before judging: the traceback is written just before exit.
        follower.finish()
        # A log that cannot be read to its end must not stop the attempt from being judged; one still
        # being read, however long, is read to its end (see _drain).
        try:
            if not await drain(reader, lambda: follower.offset):
                await cancel_and_wait(reader)
            elif not reader.cancelled():
                reader.exception()  # taken: a reader that failed said so when it did
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
                                   ExitedData(status.returncode, status.signal))])
        judgement = scheduler_judgement(status) or live.watchdog.exited(
            status.returncode, status.signal, live.killed_by_us, await self._kernel_oom(live, status))
        if not self._stop_requested.is_set():  # a user's stop is not a verdict on the job
            self._record_verdict(live, judgement)
        return judgement

    async def _kernel_oom(self, live: Live, status: ExitStatus) -> str | None:
        """The kernel's report of an OOM kill of the attempt: its cgroup's memory.events (the
        host reads them), else this machine's kernel log for a pid the attempt was seen with."""
        if status.kernel_oom is not None or status.signal != _SIGKILL or live.killed_by_us:
            return status.kernel_oom
        if not self.ctx.host.capabilities.kernel_log_here:
            return None
        pids = {live.handle.pid, live.handle.pgid} | live.known_pids
        return await asyncio.to_thread(kernel_log.oom_killed, pids)



def quiet_timeout(open_wait: float | None, *, latest_pending: bool, since_save: float, refused: bool,
                  unsaved: bool) -> float | None:
    """How long the reader waits for the log before it looks again with no new line (None: until
    a line comes).  ``open_wait``: until something the log left open is due (``_quiet_wait``);
    ``latest_pending``: a bar's latest line waits for the next save (``since_save`` seconds after
    the last one); ``refused``: the store refused the last save; ``unsaved``: events wait for it.
    While the store refuses, a pending line is tried again at the retry pace: trying at once, as
    its due time has passed, would spin the loop for as long as the lock is held or the disk full."""
    wait = open_wait
    if latest_pending:
        due = _UNSAVED_RETRY_S if refused else max(0.0, _OFFSET_SAVE_INTERVAL_S - since_save)
        wait = due if wait is None else min(wait, due)
    if unsaved:
        wait = _UNSAVED_RETRY_S if wait is None else min(wait, _UNSAVED_RETRY_S)
    return wait


def _steps(batch: list[Record]) -> list[list[Record]]:
    if len(batch) <= _RECORDS_PER_STEP:
        return [batch]
    return [batch[i:i + _RECORDS_PER_STEP] for i in range(0, len(batch), _RECORDS_PER_STEP)]


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
