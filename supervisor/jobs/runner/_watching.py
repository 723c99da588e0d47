"""One attempt watched to its judgement (``AttemptWatch``): its log followed and matched (off the
loop), events stored with the offset they bring the attempt to and then published, its exit
awaited (a pidfd: noticed at once), and the watchdog asked for a verdict whenever its own next
deadline comes, never on a fixed tick.  The runner makes one per attempt it launched or adopted,
with its collaborators (the journal it records through, the alerts and kill gate, the paces),
and awaits ``run()``: the judgement.  The wait in a batch
scheduler's queue before it, and the drain of the log to its end after the exit, are at the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

import structlog

from supervisor.core.errors import StoreError, SuperviseError
from supervisor.core.events import Event, EventKind, JobState, Phase, ProbeEvent, ProbeKind, Record, Verdict
from supervisor.core.payloads import ActionData, AlertData, ProbeFields, jsonable
from supervisor.core.tasks import cancel_and_wait, set_within
from supervisor.hosts import kernel_log
from supervisor.hosts.base import ExitStatus, Follower, Host, Link, QueuedHost, SchedulerEnd
from supervisor.jobs.matching import Matched, Matcher, PackDisabled, TailReader
from supervisor.jobs.redraw_runs import RedrawRuns
from supervisor.jobs.runner._alerts import Alerts, StragglerReports
from supervisor.jobs.runner._context import CATCH_UP_STILL_S, CatchUp, Live, RunnerContext
from supervisor.jobs.runner._disk import DiskWatch
from supervisor.jobs.runner._ending import exited
from supervisor.jobs.runner._heartbeat import Heartbeat
from supervisor.jobs.runner._journal import Journal
from supervisor.jobs.runner._launch import Paces
from supervisor.jobs.runner._verdict import Verdicts
from supervisor.jobs.runner._waits import UNREACHABLE
from supervisor.notify import notices
from supervisor.probes import Pack
from supervisor.spec.model import JobSpec
from supervisor.store.arrivals import ArrivalWriter, marks_path
from supervisor.store.attempt_writes import KEEP, AttemptUpdate
from supervisor.watchdog import ExitNoted, Judgement, SchedulerEnded, slow_step

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
_LINK_LOOK_S = 0.25  # while the host's link is down, how often the watch looks whether it is back


class AttemptWatch:
    """Watches one attempt, once: ``run()`` returns its judgement (an exit judged, or a kill the
    gate let through while it runs); the follower and matcher it opens are closed by then."""

    def __init__(self, live: Live, *, spec: JobSpec, ctx: RunnerContext, journal: Journal, alerts: Alerts,
                 verdicts: Verdicts, paces: Paces, packs: Sequence[Pack], stopped: asyncio.Event,
                 catch_up: CatchUp | None = None) -> None:
        self.live = live
        self._job = spec.name
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts
        self._verdicts = verdicts  # each verdict recorded, and the gate before a kill
        self._paces = paces
        self._stragglers = StragglerReports(ctx, journal, alerts)
        self._stopped = stopped  # the user's stop: an exit then is no verdict on the job
        row = live.row
        self._engine = Matcher(packs, row.log_offset, row.tag)
        self._follower = ctx.host.follow(live.handle.log_path, row.log_offset, row.log_generation)
        self._redraws = TailReader(self._follower, self._engine)  # a bar's unterminated latest redraw
        self._unsaved: list[Event] = []  # events a refused store write (a full disk) could not take yet
        # While a step is matched (in the matcher's thread: a cancelled reader does not stop it), the
        # engine goes past records whose events are not in _unsaved yet: a reader stopped then stores
        # the offset from before the step.
        self._step_from: int | None = None
        self._last_save = 0.0  # when the reader last stored (monotonic)
        self._refused = False  # the store refused the last save (said once in the daemon's log)
        # Re-adopted (``catch_up``): the log written while no daemon watched, dated, until read past;
        # judged at once (a deadline may have passed meanwhile), but not before that backlog is read
        # or ``_catch_up_until`` (a clock time) has come.
        self._backlog = catch_up.backlog if catch_up is not None else None
        self._catch_up_until = catch_up.until if catch_up is not None else None
        self._judge_at_once = catch_up is not None
        # Ended while nobody watched: judged by its exit (awaited), never by the clock.
        self._exited_unwatched = catch_up is not None and catch_up.exited
        # The end of the last record the reader has taken (matched, judged, stored): how far reading
        # has got, step by step (the follower's offset moves once per read of up to a MiB, before
        # the records of that read are taken).
        self._read_to = row.log_offset
        self._read_to_at_look = row.log_offset  # ... when the catch-up last looked

    async def run(self) -> Judgement:
        live = self.live
        beat = Heartbeat(live, self._journal, self._ctx.clock)
        if live.notify is not None:
            live.notify.start(beat.message)
        disk = DiskWatch(live, spec=self._spec, ctx=self._ctx, journal=self._journal, alerts=self._alerts,
                         verdicts=self._verdicts, stopped=self._stopped)
        disk.start()
        reader = asyncio.create_task(self._read(), name=f"read:{live.row.tag}")
        exit_task = asyncio.create_task(self._ctx.host.wait_exit(live.handle), name=f"exit:{live.row.tag}")
        reader_reported = False
        try:
            while True:
                timeout = self._time_to_next_check()
                live.wake.clear()
                wake = asyncio.create_task(live.wake.wait())
                waiting = {exit_task, wake} | ({reader} if not reader_reported else set())
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                if exit_task in done:
                    return await self._finish(reader, exit_task.result())
                if reader in done:
                    error = reader.exception()
                    if isinstance(error, UNREACHABLE):
                        raise error  # the host cannot be reached: the attempt waits for it, unjudged
                    # The log cannot be read (removed, unreadable disk): keep watching the process.
                    reader_reported = True
                    self._catch_up_until = None
                    self._journal.action(live.row.n, f"log following stopped ({error}); still watching the process",
                                         ActionData())
                if self._catch_up_until is not None:
                    if self._ctx.clock() < self._catch_up_until:
                        continue  # not judged on its stored past while its backlog is unread
                    if self._read_to != self._read_to_at_look:  # still reading it (slowly, under load): wait on
                        self._read_to_at_look = self._read_to
                        self._catch_up_until = self._ctx.clock() + CATCH_UP_STILL_S
                        continue
                    self._catch_up_until = None
                if self._exited_unwatched or not self._watchable():
                    continue  # no verdict on what cannot be read now, nor by the clock on what has ended
                judgement = live.watchdog.check()
                self._report_slow()
                # Stalled, silent, or hung after a failure: judged while alive, killed next
                # (or warned about first: health.action, a hold).
                if self._verdicts.gated(live, judgement):
                    self._verdicts.record_verdict(live, judgement)
                    return judgement
        finally:
            await disk.close()
            if live.notify is not None:
                live.notify.close()
            beat.close()
            self._paces.store(live)
            for task in (exit_task, reader):
                await cancel_and_wait(task)
            self._engine.close()
            await self._follower.aclose()

    def _report_slow(self) -> None:
        """A step well over its history, once per bar and step: alerted (never a kill), and stored."""
        live = self.live
        for slow in self._paces.new_slow_steps(live):
            self._journal.action(live.row.n, f"slow {slow.where}: {slow.judgement.reason}",
                                 ActionData(slow=slow_step(slow.judgement.evidence)))
            self._alerts.send_soon(live, notices.slow(self._alerts.about(live), slow.judgement, slow.where))

    def _watchable(self) -> bool:
        """Whether the attempt's output can be read now: not while its host's link is down (the
        stall and silence clocks would run on lines nobody can read)."""
        host = self._ctx.host
        return not isinstance(host, Link) or host.connected()

    def _time_to_next_check(self) -> float | None:
        live = self.live
        if self._catch_up_until is not None:  # the reader wakes the loop once the backlog is read
            return max(0.0, self._catch_up_until - self._ctx.clock())
        if self._exited_unwatched:
            return None  # its exit is awaited
        if not self._watchable():
            return _LINK_LOOK_S  # looked at again until the link is back (or the host is found unreachable)
        if self._judge_at_once:  # re-adopted: a deadline that passed while no daemon watched is due now
            self._judge_at_once = False
            return 0.0
        at = live.watchdog.next_check_at()
        live.reading.check_at = at
        kill_at = self._verdicts.kill_deadline(live)
        at = kill_at if at is None else at if kill_at is None else min(at, kill_at)
        return None if at is None else max(0.0, at - self._ctx.clock())

    # ---- the reader: the log, matched, stored ------------------------------------------------

    async def _read(self) -> None:
        root = self._ctx.arrivals
        arrivals = None if root is None else ArrivalWriter(marks_path(root, self._job, self.live.row.n))
        try:
            await self._read_each(arrivals)
        finally:
            if arrivals is not None:
                arrivals.close()
            if self._unsaved:  # the store refused the last ones: they are stored when there is room
                events = list(self._unsaved)
                offset = self._engine.resume_offset if self._step_from is None else self._step_from
                self._journal.writes.submit(lambda: self._save(events, offset, force=True))

    async def _read_each(self, arrivals: ArrivalWriter | None) -> None:
        live, engine, follower, redraws, unsaved = self.live, self._engine, self._follower, self._redraws, self._unsaved

        def quiet_wait() -> float | None:
            return quiet_timeout(self._quiet_wait(), latest_pending=live.stored_progress.pending(),
                                 since_save=time.monotonic() - self._last_save, refused=self._refused,
                                 unsaved=bool(unsaved))

        async for batch in _batches_or_quiet(follower, quiet_wait):
            if batch is None:  # the log has been quiet: complete what it left open
                if arrivals is not None:  # bytes that completed no record (a bar's trailing `\r`) came by now
                    note_arrival(arrivals, follower, self._arrived_at(follower.offset, follower.generation))
                quiet_for = self._ctx.clock() - live.watchdog.last_output_at
                if engine.has_open_traceback and quiet_for >= _TRACEBACK_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(self._matched(await engine.flush()), output=False))
                if redraws.pending() and quiet_for >= _REDRAW_QUIET_S - _QUIET_SLACK_S:
                    unsaved.extend(self._observe(await redraws.read(), output=False))
                # Rules may have come due already (these events date from the last output): look now.
                live.wake.set()
                self._caught_up(quiet=True)
                await self._store_read()
                continue
            # A backlog comes in reads of up to a MiB; taken whole, its events held the loop for
            # seconds (every `status` waited behind eight of them).  Taken a step at a time, the
            # loop's work per step stays short, and other tasks run between steps.
            if arrivals is not None:  # when the read was made, not when each step of it was taken
                note_arrival(arrivals, follower, self._arrived_at(batch[-1].offset, batch[-1].generation))
            for step in _steps(batch):
                if self._ctx.records_seen is not None:
                    self._ctx.records_seen(self._job, len(step))
                live.row.log_generation = step[-1].generation  # a batch never spans a restart of the log
                self._step_from = engine.resume_offset
                matched = self._matched(await engine.feed(step))
                live.watchdog.records_seen(step)
                unsaved.extend(self._observe(matched, records=len(step), last=step[-1]))
                self._step_from = None
                self._read_to = step[-1].end
                self._caught_up(quiet=False)
                await self._store_read()

    async def _store_read(self) -> None:
        """Store what the log brought with the offset it brings the attempt to (when it was last
        saved, and whether the store refused it, are kept for the next)."""
        writes, unsaved, engine = self._journal.writes, self._unsaved, self._engine
        force = time.monotonic() - self._last_save >= _OFFSET_SAVE_INTERVAL_S - _QUIET_SLACK_S
        try:
            if writes.now(self._save, unsaved, engine.resume_offset, force=force):
                self._last_save = time.monotonic()
            unsaved.clear()
            self._refused = False
        except StoreError as exc:
            # Keep following and judging; store what is pending with the next batch (or in a second).
            if not self._refused:
                log.error("cannot store events; will retry with the next batch", job=self._job, error=str(exc))
            while len(unsaved) >= _MAX_UNSAVED_EVENTS:  # bounded: read no further until the store takes them
                await asyncio.sleep(_UNSAVED_RETRY_S)
                with contextlib.suppress(StoreError):
                    writes.now(self._save, unsaved, engine.resume_offset, force=True)
                    unsaved.clear()
            self._refused = True

    def _arrived_at(self, offset: int, generation: int) -> float:
        """When the log's bytes from ``offset`` (in ``generation``) had arrived: now, or when a
        backlog's were written (a batch: its last record's offset; held bytes: the follower's)."""
        backlog = self._backlog
        if backlog is not None and backlog.covers(offset, generation):
            return backlog.wall_at(offset)
        return time.time()

    def _caught_up(self, *, quiet: bool) -> None:
        """A re-adopted attempt's backlog is read once the reader has taken its last record (not
        once the follower has read past it: the records of that read are then still to be taken),
        or the log has gone quiet (its unterminated tail is read then): judge it now."""
        live = self.live
        if self._catch_up_until is None:
            return
        if quiet or self._backlog is None or self._read_to >= self._backlog.end_offset:
            self._catch_up_until = None
            live.wake.set()

    def _matched(self, matched: Matched) -> list[ProbeEvent]:
        """The events matched; each pack the matcher disabled (too slow, or raising) is reported."""
        for disabled in matched.disabled:
            self._pack_disabled(disabled)
        return matched.events

    def _pack_disabled(self, disabled: PackDisabled) -> None:
        n = self.live.row.n
        message = f"probe pack '{disabled.pack}' disabled for attempt {n}: {disabled.reason}"
        self._journal.record(n, EventKind.ALERT, message,
                             AlertData(pack=disabled.pack, reason=disabled.reason))

    def _quiet_wait(self) -> float | None:
        """How long the log may stay quiet before something it left open is completed: an open
        traceback, an unterminated progress redraw.  None: nothing is open."""
        waits = []
        if self._engine.has_open_traceback:
            waits.append(_TRACEBACK_QUIET_S)
        if self._redraws.pending():
            waits.append(_REDRAW_QUIET_S)
        if not waits:
            return None
        quiet_for = self._ctx.clock() - self.live.watchdog.last_output_at
        return max(0.0, min(waits) - quiet_for)

    def _observe(self, probe_events: list[ProbeEvent], *, output: bool = True,
                 records: int = 0, last: Record | None = None) -> list[Event]:
        """Feed the watchdog (output seen, each event) and return the events to store: all but
        the progress redraws between a bar's milestones (jobs/milestones.py; ``_save`` adds
        each bar's latest line), decided here, once per event, so that a write the store refused
        is tried again with the same events.
        ``records``: how many records brought these events, ``last`` the last of them.
        ``output=False``: events completed later from records already seen, which date from the
        last output, not from now.  Records written while the daemon was down date from then."""
        live, clock = self.live, self._ctx.clock
        backlog = self._backlog if output else None
        wall = time.time()
        if backlog is not None and last is not None and backlog.covers(last.offset, last.generation):
            wall = backlog.wall_at(last.offset)
        elif backlog is not None:
            self._backlog = None  # read past what was written while no daemon watched
        if output:
            now = clock_at(clock, wall)
            heartbeats = sum(1 for pe in probe_events if pe.kind is ProbeKind.INFO and pe.fields.get("heartbeat"))
            live.watchdog.output_seen(now, heartbeats_only=0 < records <= heartbeats)
            live.reading.last_output = wall
        else:
            now = live.watchdog.last_output_at
        events: list[Event] = []  # what the alerts read
        admitted: list[Event] = []  # what is stored: the milestones and the cap decide, in the log's order
        cap, sieve, watchdog = live.event_cap, live.stored_progress, live.watchdog

        def judged(event: Event, at: float) -> None:
            before = watchdog.phase
            note(self._journal, live, event, at)
            entered = live.watchdog.phase
            if entered is not None and entered is not before and event.kind is not EventKind.PHASE:
                events.append(implied := implied_phase(event, entered))  # the phase first: its line began it
                stored(implied)
            events.append(event)

        def stored(event: Event) -> None:
            sieve.latest_only = cap.reached  # past the cap: each bar's latest, in place
            if cap.admits(event, kept=sieve.keep(event, event.ts)):
                admitted.append(event)

        def refused(lines: list[ProbeEvent]) -> None:  # a run of redraws the watchdog takes one by one
            for pe in lines:  # (the milestones took them: not stored again)
                judged(self._event(pe), now)

        # Redraws between a bar's milestones: no event made of them, one summary to the watchdog.
        runs = None if backlog is not None or self._alerts.read_each_step(live) else \
            RedrawRuns(watchdog, sieve, cap, job=self._job, attempt=live.row.n, generation=live.row.log_generation, ts=wall,
                       at=now, feed=refused)
        for pe in probe_events:
            if runs is not None and runs.take(pe):
                continue
            # A plain info line that would change nothing in the watchdog (an access-log line of a server
            # already serving) is not fed to it, and past the event cap, where it would not be stored,
            # it is only counted: no event is made of it.
            if (backlog is None and pe.kind is ProbeKind.INFO and pe.failure is None
                    and watchdog.unchanged_by(pe.probe, pe.phase, pe.fields, now)):
                if cap.reached:
                    cap.drop()
                    continue
                event = self._event(pe)
                events.append(event)
                stored(event)
                continue
            event = self._event(pe)
            at = now
            if backlog is not None and event.offset is not None and backlog.covers(event.offset, event.generation):
                event.ts = backlog.wall_at(event.offset)  # stored with when it was written, not read
                at = clock_at(clock, event.ts)
            judged(event, at)
            stored(event)
        if runs is not None:
            runs.close()
        self._alerts.observed(live, events)
        if found := live.watchdog.stragglers():
            self._stragglers.found(live, found)
        notice = live.event_cap.notice()
        if notice is not None:
            self._journal.action(live.row.n, notice, ActionData(events_per_attempt=live.event_cap.limit))
        return admitted

    def _event(self, pe: ProbeEvent) -> Event:
        event = _from_probe(self._job, self.live.row.n, pe)
        event.generation = self.live.row.log_generation
        return event

    def _save(self, events: list[Event], offset: int, *, force: bool) -> bool:
        """Store the events with the offset they bring the attempt to (one transaction), publish them."""
        if not events and not force:
            # A bar's latest line alone is stored with the offset at most every _OFFSET_SAVE_INTERVAL_S
            # (the reader wakes for it when the log goes quiet), not by a transaction for each read
            # of a busy bar (with the watchdog's state looked up for it, a quarter of the loop's
            # samples at 8 x 1000 lines/s).  A daemon killed meanwhile resumes from the offset
            # stored with the row, and reads those redraws again.
            return False
        live = self.live
        latest, replaced = live.stored_progress.to_save()  # each bar's latest line, in place of the one before
        state = live.watchdog.state()  # one look per batch: what to store, and when to look again
        failure = state.failure
        update = AttemptUpdate(log_offset=offset, phase=state.phase, log_generation=live.row.log_generation,
                               progress=KEEP if state.progress is None else state.progress.standing(),
                               failure=KEEP if failure is None else failure,
                               fingerprint=KEEP if failure is None else failure.fingerprint)
        recorder = self._journal.recorder
        if events or latest:
            # Milestones only are published: a bar's latest line stands for its end until the next
            # write replaces it, so that a follower of the bus (events -f, the page) is not sent each one.
            recorder.events(events, unpublished=latest, update=update, replaced=replaced)
            live.stored_progress.saved()
        else:
            recorder.store.update_attempt(self._job, live.row.n, update)
        live.row.log_offset = offset
        # Wake the watch loop only if the watchdog now wants to look earlier than planned:
        # progress only pushes deadlines later, and a wake-up per batch is costly on busy logs.
        live.wake_if_sooner(state.next_check_at)
        return True

    # ---- the exit ------------------------------------------------------------------------------

    async def _finish(self, reader: asyncio.Task[None], status: ExitStatus) -> Judgement:
        live, follower = self.live, self._follower
        # Drain the log to its end before judging: the traceback is written just before exit.
        follower.finish()
        # A log that cannot be read to its end must not stop the attempt from being judged; one still
        # being read, however long, is read to its end (see ``drain``).
        read_to_end = True
        try:
            if not await drain(reader, lambda: self._read_to):
                read_to_end = False
                await cancel_and_wait(reader)
            elif not reader.cancelled():
                error = reader.exception()  # taken: a reader that failed said so when it did
                if isinstance(error, UNREACHABLE):
                    raise error  # read once the host answers (the attempt is re-adopted), then judged
        except asyncio.CancelledError:
            # The reader was cancelled: judge anyway.  This task being cancelled (the daemon
            # detaching at shutdown) must go through, or the runner would relaunch regardless.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        try:
            flushed = self._matched(await asyncio.wait_for(self._engine.flush(), timeout=10))
        except Exception:  # noqa: BLE001 - a matcher stuck on a costly chunk must not hold up the verdict
            flushed = []
        # Where reading got to: the follower's offset is past records a reader given up on never took.
        events, offset = self._observe(flushed), follower.offset if read_to_end else self._read_to
        self._journal.writes.submit(lambda: self._save(events, offset, force=True))
        exited(self._journal, live, status)
        judgement = scheduler_judgement(status) or live.watchdog.exited(
            status.returncode, status.signal, live.killed_by_us, await self._kernel_oom(status), status.limit_hit)
        if status.cpu_throttled_s is not None:  # its cpu_max never ends it, but how much it held it back is evidence
            judgement = replace(judgement, evidence=ExitNoted(judgement.evidence,
                                                              cpu_throttled_s=round(status.cpu_throttled_s, 3)))
        if not read_to_end:  # judged on part of its log: the verdict says so
            judgement = replace(judgement, reason=f"{judgement.reason}; its log was not read to its end (read to "
                                                  f"byte {offset:,}, then reading stopped moving for {DRAIN_STALL_S:.0f}s)",
                                evidence=ExitNoted(judgement.evidence, log_read_to=offset))
        if not self._stopped.is_set():  # a user's stop is not a verdict on the job
            self._verdicts.record_verdict(live, judgement)
        return judgement

    async def _kernel_oom(self, status: ExitStatus) -> str | None:
        """The kernel's report of an OOM kill of the attempt: its cgroup's memory.events (the
        host reads them), else this machine's kernel log for a pid the attempt was seen with."""
        live = self.live
        if status.kernel_oom is not None or status.signal != _SIGKILL or live.killed_by_us:
            return status.kernel_oom
        if not self._ctx.host.capabilities.kernel_log_here:
            return None
        pids = {live.handle.pid, live.handle.pgid} | live.known_pids
        return await asyncio.to_thread(kernel_log.oom_killed, pids)


def note_arrival(arrivals: ArrivalWriter, follower: Follower, at: float) -> None:
    """The log had been read to the follower's position (its held bytes included) by ``at``.
    The held bytes (a bar's latest redraw, its trailing ``\r`` included) arrived then too: a bar
    frozen there is never completed, and without a mark covering every byte of it its line would
    be stamped with the time of each query (and, once the attempt ended, with none).  Noted after
    each batch, and when the log goes quiet: a ``\r`` written on its own after its text (``print(...,
    end="\r")`` into an unbuffered stream is two writes) completes no record, so no batch brings it."""
    arrivals.arrived(follower.generation, follower.offset + follower.buffered, at)


def note(journal: Journal, live: Live, event: Event, now: float | None = None) -> bool:
    """Feed the watchdog one event (a fault in it is contained: supervision goes on).  Returns
    False when the event changed nothing the watchdog judges by (``Watchdog.observe``)."""
    changed = True
    try:
        changed = live.watchdog.observe(event, now)
    except Exception as exc:  # noqa: BLE001 - contained: a live process is never left unsupervised
        _contained(journal, live, f"the watchdog could not take an event of probe {event.probe}", exc)
    if event.failure is not None:
        live.reading.failure = live.watchdog.failure  # the root cause, not the latest echo of it
    return changed


def replay(journal: Journal, live: Live, events: list[Event], clock: Callable[[], float]) -> None:
    """A re-adopted attempt's stored events fed to its watchdog again, each at its own time, so that
    phase, progress, rate, failure and every deadline are what they were, not reset by the restart."""
    for event in events:
        note(journal, live, event, clock_at(clock, event.ts))
    live.watchdog.stragglers()  # found in what was stored: reported by the daemon before, or too late now
    if events:
        live.reading.last_output = events[-1].ts
    # Each bar's stored stand-in row is replaced by its next line, as the daemon before would have.
    live.stored_progress.resume([e for e in events if e.kind is EventKind.PROGRESS])


def output_read_to(live: Live, wall: float, clock: Callable[[], float]) -> None:
    """A re-adopted attempt's log was read to its end by the daemon before, its last line written
    at ``wall``: its output is taken as last seen then, unless a later line is known."""
    if live.last_output is None or wall > live.last_output:
        live.watchdog.output_seen(clock_at(clock, wall), heartbeats_only=True)  # it shows no activity
        live.reading.last_output = wall


def _contained(journal: Journal, live: Live, what: str, exc: Exception) -> None:
    """A fault kept from ending supervision: logged, and stored as an event once per kind."""
    key = f"{what}:{type(exc).__name__}"
    if key in live.reading.contained:
        return
    live.reading.contained.add(key)
    log.error("fault contained; supervision goes on", job=journal.job, what=what, error=repr(exc))
    journal.action(live.row.n, f"{what} ({type(exc).__name__}: {exc}); it was skipped, supervision goes on",
                   ActionData(error=repr(exc)))


def clock_at(clock: Callable[[], float], wall: float) -> float:
    """A wall-clock time on ``clock`` (the watchdog's)."""
    return clock() - (time.time() - wall)


def implied_phase(event: Event, phase: Phase) -> Event:
    """The phase an event of another kind put the attempt in (a shard bar: weight_loading), stored
    as a phase event of its own: `events --kind phase`, the report and the page list every phase
    `status` names, not only those a phase line announced."""
    return Event(job=event.job, attempt=event.attempt, kind=EventKind.PHASE, message=event.message, ts=event.ts,
                 probe=event.probe, phase=phase, offset=event.offset, generation=event.generation,
                 data=ProbeFields({"implied_by": event.kind.value}).to_json())


def _from_probe(job: str, n: int, pe: ProbeEvent) -> Event:
    return Event(job=job, attempt=n, kind=EventKind(pe.kind.value), message=pe.line, probe=pe.probe,
                 phase=pe.phase, offset=pe.offset, data=ProbeFields(jsonable(pe.fields)).to_json(),
                 failure=pe.failure)


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


# ---- a batch scheduler's queue -----------------------------------------------------------------
# Attempts a batch scheduler holds: the wait in its queue, and its word on how they ended.
#
# While a scheduler (Slurm) keeps an attempt PENDING there is no process and no output: the
# attempt is never judged stalled or silent then.  The job shows WAITING with the scheduler's
# reason (Resources, Priority, JobHeldUser, ...), and the watchdog starts when the attempt does.
# When the scheduler says what ended an attempt (preempted, its time limit, its memory limit),
# that is the verdict: the exit code alone would read as a crash.

_QUEUE_POLL_S = 1.0  # how often a pending attempt's place in the queue is looked at

_VERDICTS = {
    SchedulerEnd.PREEMPTED: Verdict.PREEMPTED,
    SchedulerEnd.TIMEOUT: Verdict.TIMEOUT,
    SchedulerEnd.OUT_OF_MEMORY: Verdict.OOM,
}


async def wait_while_queued(host: Host, live: Live, stopped: asyncio.Event, journal: Journal) -> None:
    """Return once the attempt runs (or ended, or ``stopped`` is set); the job shows the
    scheduler's reason meanwhile (recorded in the runner's ``journal``).  Hosts without a queue
    return at once."""
    if not isinstance(host, QueuedHost):
        return
    shown: str | None = None
    while not stopped.is_set():
        try:
            state = await host.queue_state(live.handle)
        except SuperviseError as exc:  # cannot ask now: watch it; its exit is still awaited
            log.warning("cannot read the attempt's place in the queue", job=journal.job, error=str(exc))
            return
        if not state.pending:
            if shown is not None:
                # Judged from when it started, not from when it was queued.
                live.reading.watchdog = live.watchdog.anew()
                where = f" on {state.detail}" if state.detail else ""
                journal.set_job(JobState.RUNNING, f"attempt {live.row.n} running{where}")
            return
        if state.reason != shown:
            shown = state.reason
            scheduler_job = live.handle.scheduler_id or "?"
            journal.set_job(JobState.WAITING, f"attempt {live.row.n} queued: scheduler job {scheduler_job} "
                                              f"PENDING ({state.reason or 'no reason given'})")
            journal.action(live.row.n, f"queued by the scheduler: PENDING ({state.reason or 'no reason given'})",
                           ActionData(reason=state.reason))
        await set_within(stopped, _QUEUE_POLL_S)


def scheduler_judgement(status: ExitStatus) -> Judgement | None:
    """The verdict a scheduler's word on the attempt's end gives, or None (it said nothing more)."""
    if status.scheduler_end is None:
        return None
    evidence = SchedulerEnded(status.scheduler_end.value, status.returncode, status.signal)
    return Judgement(_VERDICTS[status.scheduler_end], status.describe(), evidence)


# Reading an ended attempt's log to its end before it is judged.
#
# The traceback is written just before the exit, so the verdict waits for the reader.  A fixed bound
# on that wait cut off fast writers: a job that wrote its log faster than the daemon reads it (a tqdm
# bar at full speed, 8 jobs on 2 cores) ended long before its log was read, and the end of the log —
# where the failure is — was never read.  So the bound is on *no progress*, and progress is the
# reader's own: each step of records it takes (matched, judged, stored), not the follower's offset,
# which moves once per read of up to a MiB and, with fifty readers taking turns, stood still for
# longer than the bound while every reader was busy.  Nor is time the reader had no turn counted:
# the wait looks every ``look_s``, and a look that comes late (the daemon had no CPU, or was stopped)
# counts as one look, not as the time it missed.  Only a reader that is given its turns and still
# takes nothing for ``stall_s`` is given up on; the verdict then says how far the log was read.

DRAIN_STALL_S = 30.0  # a reader that takes nothing for this long is given up on: judged as far as it read
_LOOK_S = 1.0  # how often the wait looks at the reader's progress


async def drain(reader: asyncio.Task[None], progress: Callable[[], int], stall_s: float = DRAIN_STALL_S,
                look_s: float = _LOOK_S) -> bool:
    """Wait until ``reader`` ends, or until ``progress()`` has not moved through ``stall_s`` of
    looks ``look_s`` apart; True if it ended.  The reader is not cancelled here: the caller
    decides what a stuck reader gets."""
    loop = asyncio.get_running_loop()
    last, still = progress(), 0.0
    while True:
        looked = loop.time()
        done, _ = await asyncio.wait({reader}, timeout=look_s)
        if done:
            return True
        now = progress()
        if now != last:
            last, still = now, 0.0
            continue
        still += min(look_s, loop.time() - looked)  # a late look counts its own interval, not the time missed
        if still >= stall_s:
            return False
