"""Probe matching off the event loop, within a time budget, with faults contained.

RE2 matches in time linear in text x pattern, but the pattern factor of a valid pack can
still reach a minute of CPU per MB of log; on the event loop that froze the daemon for every
job (and again after a restart, since following resumes through the same pack).  So each
watched attempt matches in a worker thread of its own: google-re2 releases the GIL while it
matches (measured: a ticker thread kept its 1 ms sleep cadence, worst gap 10 ms, through a
3 s match of a slow pack), so the loop keeps answering.

The records of a batch are matched in chunks of at most ``_CHUNK_BYTES``; each chunk has a
CPU-time budget in proportion to its size (``_MAX_S_PER_MB``, at least ``_MIN_BUDGET_S``).  A
chunk over budget has its events kept, and the pack that costs the most on it is disabled
for this attempt: the other packs, and supervision, go on.  A pack whose matching raises
(a crafted line, a pattern the literal extractor cannot take) is disabled the same way and
the chunk matched again without it.  Each disabled pack is reported once (``PackDisabled``).

A busy log is read a line or two at a time, and handing such a read to the worker and back
costs two thread wake-ups, about 50 us of CPU on 2 vCPUs, against a few us to match it: most of
the daemon's cost per followed line at 8 x 1000 lines/s (tests/perf/RESULTS.md §39).  So a small
read (``_INLINE_BYTES``) is matched on the loop once the attempt's matcher has shown, over
``_INLINE_AFTER_BYTES`` matched in the worker, what its packs cost a byte: when a read of that
size is then expected to take at most ``_INLINE_READ_S`` (a line or two of built-in packs: ~0.1 ms;
a costly user pack's read stays in the worker), while the worker is idle (calls stay in order) and
no other attempt's chunk is being matched (the lane).  A read matched on the loop that
took over ``_INLINE_HOLD_S`` sends every later read of the attempt back to the worker.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from supervisor.core.events import ProbeEvent, ProbeKind, Record
from supervisor.probes import Pack, ProbeEngine

log = structlog.get_logger("supervise.matching")

_CHUNK_BYTES = 16 << 10  # a chunk is this much log at most (or one longer record)
_MAX_S_PER_MB = 16.0  # CPU seconds per MB a pack set may take; built-in packs take well under 1
_MIN_BUDGET_S = 0.25  # a small chunk still gets this much: timing a few lines says little
_SAMPLE_BYTES = 4 << 10  # how much of a chunk each pack is timed on, to find the costly one
# One attempt's chunk is matched at a time, whichever attempt's: the GIL lets one thread run
# Python anyway, and every thread waiting for it is one more the event loop may queue behind
# (up to 5 ms each) whenever it lets go of the GIL, at each system call.  Eight attempts reading
# a backlog, each matching in its own thread at once: `status` p50 537 ms; taking turns: 48 ms
# (tests/perf/RESULTS.md §18b).
_LANE = threading.Lock()
_INLINE_BYTES = 4 << 10  # a read this small may be matched on the loop (see the module's doc)
_INLINE_AFTER_BYTES = 64 << 10  # matched in the worker first, to measure what the packs cost
_INLINE_READ_S = 0.001  # the most a read matched on the loop is expected to take, at the cost measured so far
_INLINE_HOLD_S = 0.005  # a read on the loop that took longer ends matching on the loop for the attempt

T = TypeVar("T")


@dataclass(frozen=True)
class PackDisabled:
    """A pack that no longer reads this attempt's log, and why."""

    pack: str
    reason: str


@dataclass
class Matched:
    events: list[ProbeEvent] = field(default_factory=list)
    disabled: list[PackDisabled] = field(default_factory=list)


class _Worker:
    """One daemon thread running calls in order (a daemon thread: one stuck in a slow match
    never holds up the daemon's exit)."""

    def __init__(self, name: str) -> None:
        # (call, loop, future): loop and future None for a call nobody waits for; None: stop
        self._calls: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop | None, asyncio.Future[Any] | None] | None]
        self._calls = queue.SimpleQueue()
        # Each counter is written by one thread only: calls sent (the caller's), calls served (the worker's).
        self.sent = 0
        self.served = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Every call sent has been served (a call given up on by its caller included)."""
        return self.served == self.sent

    async def call(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.sent += 1
        self._calls.put((fn, loop, future))
        return await future

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in turn, nobody waiting for it (it must contain its own errors)."""
        self.sent += 1
        self._calls.put((fn, None, None))

    def close(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, loop, future = item
            try:
                outcome: tuple[Any, BaseException | None] = (fn(), None)
            except Exception as exc:  # noqa: BLE001 - contained: see the module's doc
                outcome = (None, exc)
            self.served += 1
            if loop is None or future is None:  # posted: nobody waits
                continue
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Matcher:
    """The probe engine of one attempt, run in a worker thread.  Calls are served in order;
    ``resume_offset`` and ``has_open_traceback`` are read between calls."""

    def __init__(self, packs: Sequence[Pack], start_offset: int, name: str) -> None:
        self.packs: list[Pack] = list(packs)
        self._engine: ProbeEngine | None = None  # built in the worker: compiling may be slow or raise
        self._start = start_offset
        self._tail: ProbeEngine | None = None
        self._worker = _Worker(f"match:{name}")
        # Compiled now, in the worker, rather than on the first line: the attempt's first
        # output is matched at once, and the compile's cost is the attempt's, not its lines'.
        self._early = Matched()  # what building it disabled, handed out with the first feed
        self._early_unused = True
        # What matching has cost so far (CPU seconds over bytes): whether a small read may be matched on the loop.
        self._cost_s = 0.0
        self._cost_bytes = 0
        self._inline_off = False  # a read matched on the loop took too long: the worker's from then on
        self._worker.post(self._build_early)

    @property
    def resume_offset(self) -> int:
        return self._engine.resume_offset if self._engine is not None else self._start

    @property
    def has_open_traceback(self) -> bool:
        return self._engine is not None and self._engine.has_open_traceback

    async def feed(self, records: Sequence[Record]) -> Matched:
        if self._may_match_here(records) and _LANE.acquire(blocking=False):
            started = time.thread_time()
            try:
                return self._feed(records, in_lane=True)
            finally:
                _LANE.release()
                if time.thread_time() - started > _INLINE_HOLD_S:
                    self._inline_off = True
        return await self._worker.call(lambda: self._feed(records))

    def matches_on_the_loop(self, size: int) -> bool:
        """Whether a read of ``size`` bytes is matched on the loop now (see the module's doc)."""
        return (not self._inline_off and size <= _INLINE_BYTES and self._cost_bytes >= _INLINE_AFTER_BYTES
                and self._cost_s * size <= _INLINE_READ_S * self._cost_bytes)

    def _may_match_here(self, records: Sequence[Record]) -> bool:
        return (bool(records) and self._engine is not None and self._worker.idle
                and self.matches_on_the_loop(records[-1].end - records[0].offset))

    async def flush(self) -> Matched:
        return await self._worker.call(self._flush)

    async def read_tail(self, record: Record) -> list[ProbeEvent]:
        """The progress events of an unterminated tail, read apart from the log's records."""
        return await self._worker.call(lambda: self._read_tail(record))

    def close(self) -> None:
        self._worker.close()

    # ---- in the worker thread ------------------------------------------------------------

    def _build_early(self) -> None:
        try:
            self._built(self._early, self._start)
        except Exception as exc:  # noqa: BLE001 - every pack failed: the first feed raises it again
            log.warning("the probe engine could not be built", error=repr(exc))

    def _feed(self, records: Sequence[Record], *, in_lane: bool = False) -> Matched:
        out, self._early = self._early, Matched()
        if self._early_unused and records and records[0].offset != self._start:
            self._engine = None  # the log restarted before its first line was read: built again there
        self._early_unused = False
        for chunk in _chunks(records):
            if in_lane:
                self._feed_chunk_in_lane(chunk, out)
            else:
                self._feed_chunk(chunk, out)
        return out

    def _feed_chunk(self, chunk: Sequence[Record], out: Matched) -> None:
        with _LANE:
            self._feed_chunk_in_lane(chunk, out)

    def _feed_chunk_in_lane(self, chunk: Sequence[Record], out: Matched) -> None:
        while True:
            engine = self._built(out, chunk[0].offset)
            started = time.thread_time()
            try:
                events = engine.feed_many(chunk)
            except Exception as exc:  # the culprit is disabled, or it is raised when none is left
                if not self.packs:
                    raise
                # The engine's state is suspect: rescue what it completed, match the chunk again.
                culprit = self._costliest(chunk, whole=True)
                self._disable(culprit, f"matching raised {type(exc).__name__}: {exc}", out)
                self._restart(engine, chunk[0].offset, out)
                continue
            out.events.extend(events)
            spent = time.thread_time() - started
            self._cost_s += spent
            self._cost_bytes += chunk[-1].end - chunk[0].offset
            budget = _budget(chunk)
            if spent > budget and self.packs:
                size_kib = (chunk[-1].end - chunk[0].offset) / 1024
                culprit = self._costliest(chunk, whole=False)
                self._disable(culprit, f"matching took {spent:.1f}s of CPU for {size_kib:.0f} KiB of log "
                                       f"(budget {budget:.2f}s)", out)
                self._restart(engine, chunk[-1].end, out)
            return

    def _flush(self) -> Matched:
        out = Matched()
        with _LANE:
            self._flush_in_lane(out)
        return out

    def _flush_in_lane(self, out: Matched) -> None:
        if self._engine is not None:
            try:
                out.events.extend(self._engine.flush())
            except Exception as exc:  # noqa: BLE001 - contained: see the module's doc
                log.warning("probe engine flush failed", error=repr(exc))

    def _read_tail(self, record: Record) -> list[ProbeEvent]:
        with _LANE:
            return self._read_tail_in_lane(record)

    def _read_tail_in_lane(self, record: Record) -> list[ProbeEvent]:
        try:
            if self._tail is None:
                self._tail = ProbeEngine(self.packs, start_offset=record.offset)
            # flush() ends whatever the tail may have opened: each read starts clean.
            events = self._tail.feed_many([record]) + self._tail.flush()
        except Exception as exc:  # noqa: BLE001 - contained: see the module's doc
            log.warning("reading the log's unterminated tail failed", error=repr(exc))
            self._tail = None
            return []
        return [e for e in events if e.kind is ProbeKind.PROGRESS]

    def _built(self, out: Matched, offset: int) -> ProbeEngine:
        while self._engine is None:
            try:
                self._engine = ProbeEngine(self.packs, start_offset=offset)
            except Exception as exc:  # the culprit is disabled, or it is raised when none is left
                if not self.packs:
                    raise
                self._disable(self._unbuildable(), f"cannot be compiled for matching: {type(exc).__name__}: {exc}", out)
        return self._engine

    def _restart(self, engine: ProbeEngine, offset: int, out: Matched) -> None:
        """Replace the engine by one without the disabled packs, from ``offset``."""
        try:
            out.events.extend(e for e in engine.flush() if e.offset < offset)
        except Exception as exc:  # noqa: BLE001 - contained: see the module's doc
            log.warning("the probe engine could not hand over what it held", error=repr(exc))
        self._engine = None
        self._tail = None
        self._built(out, offset)

    def _disable(self, pack: Pack | None, reason: str, out: Matched) -> None:
        victims = [pack] if pack is not None else list(self.packs)  # not one alone: all of them
        for victim in victims:
            self.packs.remove(victim)
            out.disabled.append(PackDisabled(victim.name, reason))
            log.warning("probe pack disabled for this attempt", pack=victim.name, reason=reason)

    def _costliest(self, chunk: Sequence[Record], *, whole: bool) -> Pack | None:
        """The pack that raises on ``chunk``, or costs the most CPU on its start (``whole``:
        on all of it, to find the one that raises)."""
        if len(self.packs) <= 1:
            return self.packs[0] if self.packs else None
        sample = chunk if whole else _sample(chunk)
        costs: list[tuple[float, int]] = []
        for index, pack in enumerate(self.packs):
            started = time.thread_time()
            try:
                engine = ProbeEngine([pack], start_offset=sample[0].offset)
                engine.feed_many(sample)
                engine.flush()
            except Exception:  # noqa: BLE001 - contained: see the module's doc
                return pack
            costs.append((time.thread_time() - started, index))
        return self.packs[max(costs)[1]]

    def _unbuildable(self) -> Pack | None:
        for pack in self.packs:
            try:
                ProbeEngine([pack])
            except Exception:  # noqa: BLE001 - contained: see the module's doc
                return pack
        return None


def _chunks(records: Sequence[Record]) -> list[Sequence[Record]]:
    if not records or records[-1].end - records[0].offset <= _CHUNK_BYTES:
        return [records] if records else []  # the usual batch: no look at each record
    chunks: list[Sequence[Record]] = []
    start = 0
    for i, record in enumerate(records):
        if record.end - records[start].offset > _CHUNK_BYTES and i > start:
            chunks.append(records[start:i])
            start = i
    if start < len(records):
        chunks.append(records[start:])
    return chunks


def _sample(chunk: Sequence[Record]) -> Sequence[Record]:
    for i, record in enumerate(chunk):
        if record.end - chunk[0].offset >= _SAMPLE_BYTES:
            return chunk[: i + 1]
    return chunk


def _budget(chunk: Sequence[Record]) -> float:
    size_mb = (chunk[-1].end - chunk[0].offset) / 1e6
    return max(_MIN_BUDGET_S, size_mb * _MAX_S_PER_MB)


class TailReader:
    """Reads progress from the log's unterminated tail (a tqdm redraw awaiting the next one).

    The tail goes through an engine of its own, so that the main engine's state (open
    tracebacks, lent prefixes) never sees text that is not a record yet; only progress events
    are kept.  Each is stored at the offset where the tail starts, the offset its record will
    have: when the record is complete, its event is the same and the store keeps one."""

    def __init__(self, follower: Any, matcher: Matcher) -> None:
        self._follower = follower
        self._matcher = matcher
        self._read_at: tuple[int, str] | None = None

    def pending(self) -> bool:
        """An unterminated tail not read yet."""
        text = self._follower.partial_text()
        return bool(text.strip()) and (self._follower.offset, text) != self._read_at

    async def read(self) -> list[ProbeEvent]:
        text = self._follower.partial_text()
        offset = self._follower.offset
        self._read_at = (offset, text)
        record = Record(text=text, offset=offset, end=offset + len(text.encode()), redraw=True)
        return await self._matcher.read_tail(record)
