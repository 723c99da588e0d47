"""What a job runner works with: its context (store, bus, host, alerter, GPU view), the live
handles and state of the attempt it watches (``Live``, split by owner), what a re-adopted
attempt's watch starts from (``CatchUp``: the backlog written while no daemon watched), and
small helpers that turn values into what is stored."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.core.bus import EventBus
from supervisor.core.events import Failure
from supervisor.core.usage import GpuUsageMeter
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.base import ExitStatus, Host, ProcessHandle
from supervisor.hosts.local.notify import NotifySocket
from supervisor.hosts.stacks import StackDump
from supervisor.jobs.event_cap import DEFAULT_LIMIT as DEFAULT_EVENT_CAP
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.milestones import ProgressMilestones
from supervisor.jobs.quarantine import Quarantines
from supervisor.jobs.recorder import Recorder
from supervisor.notify.alerts import Alerter
from supervisor.store.database import AttemptRow, Store
from supervisor.watchdog import Watchdog


class GpuView:
    """What a runner needs of the daemon's GPU sampler."""

    def __init__(self, sample: Callable[[], Awaitable[GpuSample]], latest: Callable[[], GpuSample | None],
                 next_sample: Callable[[], Awaitable[GpuSample]] | None = None) -> None:
        self.sample = sample  # one taken now
        self.latest = latest
        # the next one the sampler takes on its own (default: one taken now)
        self.next_sample = next_sample or sample


@dataclass
class RunnerContext:
    store: Store
    bus: EventBus
    recorder: Recorder  # the one writer of events and job states: store, then publish
    host: Host
    alerter: Alerter
    gpu: GpuView
    clock: Callable[[], float] = time.monotonic
    # Wall-clock time the previous daemon was last known alive (its heartbeat), during the
    # recovery pass only: what a re-adopted attempt's `daemon_restarted` event says.
    down_since: float | None = None
    records_seen: Callable[[str, int], None] | None = None  # (job, records read): the metrics' counter
    arrivals: Path | None = None  # where each attempt's arrival marks go (arrivals.py); None: not noted
    events_per_attempt: int = DEFAULT_EVENT_CAP  # the settings' cap on an attempt's stored log events
    # Where each attempt's NOTIFY_SOCKET is bound (hosts/local/notify.py); None: the host is remote,
    # where a program could not reach it.
    notify_dir: Path | None = None
    quarantines: Quarantines | None = None  # the GPUs and hosts kept away from (None: none are)
    # Another host's context: where a job with a host pool moves (KeepAway, runner/_waits.py).
    context_for: Callable[[str], RunnerContext] | None = None


# An attempt's live state, split by owner: each part below is assigned in its owner's module
# only (tests/test_live_owners.py), and ``Live`` gives every reader the whole, read-only.

@dataclass(frozen=True)
class Handles:
    """What an attempt is, set at its launch (``_launch``) or adoption (``_adopting``), never
    replaced: its row, its process, what its GPU memory is measured against."""

    row: AttemptRow
    handle: ProcessHandle
    # GPU memory in use on each device when it was launched (or adopted): what its release is measured against.
    gpu_baseline: dict[int, int] = field(default_factory=dict)
    notify: NotifySocket | None = None  # its NOTIFY_SOCKET, bound before launch (or at adoption)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the watch loop (anyone may set it)
    gpu_meter: GpuUsageMeter = field(default_factory=GpuUsageMeter)  # its GPU memory and GPU-seconds


@dataclass
class Reading:
    """What the watch has read of the attempt (owner: ``_watching``)."""

    watchdog: Watchdog
    event_cap: EventCap = field(default_factory=EventCap)  # how many of its log's events it stores
    # Which progress lines are stored (its milestones); the watchdog sees them all.
    stored_progress: ProgressMilestones = field(default_factory=ProgressMilestones)
    last_output: float | None = None
    failure: Failure | None = None  # the root cause of the failures logged
    check_at: float | None = None  # when the watch loop will next ask the watchdog
    contained: set[str] = field(default_factory=set)  # faults already reported (once each)


@dataclass
class Kill:
    """The kill and the stacks that go with it (owner: ``_verdict``)."""

    killed_by_us: bool = False
    stacks: StackDump | None = None  # dumped at a warning or before the kill, for the alert
    stacks_pending: asyncio.Task[None] | None = None  # a warning's dump under way (a kill waits for it)


@dataclass
class End:
    """How the attempt's command ended, once known (owner: ``_ending``)."""

    exit_status: ExitStatus | None = None


@dataclass
class Processes:
    """The attempt's processes as the runner has seen them (owner: ``_job``)."""

    known_pids: set[int] = field(default_factory=set)
    pids_read_at: float | None = None  # when the attempt's process tree was last read (GPU samples)
    program_pid: int | None = None  # the program the wrapper runs, once seen


@dataclass
class Notified:
    """What the attempt said on its NOTIFY_SOCKET (owner: ``_heartbeat``)."""

    status_line: str | None = None  # the latest STATUS= it sent there


@dataclass
class Live:
    """Live handles and state of the attempt being watched (never saved: the store has the saved
    state).  Its parts are written by their owners; what is read is read here."""

    handles: Handles
    reading: Reading
    kill: Kill = field(default_factory=Kill)
    end: End = field(default_factory=End)
    procs: Processes = field(default_factory=Processes)
    notified: Notified = field(default_factory=Notified)

    @classmethod
    def of(cls, row: AttemptRow, handle: ProcessHandle, watchdog: Watchdog, *, event_cap: EventCap,
           gpu_baseline: dict[int, int], notify: NotifySocket | None) -> Live:
        return cls(Handles(row, handle, gpu_baseline, notify), Reading(watchdog, event_cap))

    @property
    def row(self) -> AttemptRow:
        return self.handles.row

    @property
    def handle(self) -> ProcessHandle:
        return self.handles.handle

    @property
    def gpu_baseline(self) -> dict[int, int]:
        return self.handles.gpu_baseline

    @property
    def notify(self) -> NotifySocket | None:
        return self.handles.notify

    @property
    def wake(self) -> asyncio.Event:
        return self.handles.wake

    @property
    def gpu_meter(self) -> GpuUsageMeter:
        return self.handles.gpu_meter

    @property
    def watchdog(self) -> Watchdog:
        return self.reading.watchdog

    @property
    def event_cap(self) -> EventCap:
        return self.reading.event_cap

    @property
    def stored_progress(self) -> ProgressMilestones:
        return self.reading.stored_progress

    @property
    def last_output(self) -> float | None:
        return self.reading.last_output

    @property
    def failure(self) -> Failure | None:
        return self.reading.failure

    @property
    def killed_by_us(self) -> bool:
        return self.kill.killed_by_us

    @property
    def stacks(self) -> StackDump | None:
        return self.kill.stacks

    @property
    def stacks_pending(self) -> asyncio.Task[None] | None:
        return self.kill.stacks_pending

    @property
    def exit_status(self) -> ExitStatus | None:
        return self.end.exit_status

    @property
    def known_pids(self) -> AbstractSet[int]:
        return self.procs.known_pids

    @property
    def program_pid(self) -> int | None:
        return self.procs.program_pid

    @property
    def status_line(self) -> str | None:
        return self.notified.status_line

    def wake_if_sooner(self, at: float | None) -> None:
        """Wake the watch loop when the watchdog now wants to look (at ``at``) earlier than planned."""
        check_at = self.reading.check_at
        if at is not None and (check_at is None or at < check_at):
            self.wake.set()

    def ended_at(self) -> float:
        """When the attempt's command ended: the time its exit status was written where the host
        tells (a re-adopted attempt may have ended long before this daemon saw it), else now."""
        now = time.time()
        written = self.exit_status.ended_at if self.exit_status is not None else None
        return now if written is None else min(now, max(self.row.started, written))


def describe_exit(status: ExitStatus | None) -> str:
    return status.describe() if status is not None else "was still running when watching stopped"


def gpu_summary(sample: GpuSample | None) -> str:
    if sample is None or not sample.available:
        # Said after "GPU: " wherever it is shown: no prefix of its own.
        return "not monitored" if sample is None else sample.reason
    return "; ".join(f"GPU{d.index} {d.used_mib}/{d.total_mib} MiB" for d in sample.devices)


def cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:80]
    except psutil.Error:
        return "(gone)"


async def cancel_until_done(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` until it has ended: a cancellation that lands just as an awaited result
    completes is swallowed (asyncio.wait_for before 3.12, suppress(CancelledError))."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    with contextlib.suppress(asyncio.CancelledError):
        await task


# The part of a log written while the daemon was down, dated.
#
# A re-adopted attempt's log is read again from the stored offset; what lies between that offset
# and the log's size at adoption was written while no daemon watched.  Dated at the moment it is
# read, a hundred progress lines would all share the restart's time: their intervals would read
# as zero (a rate of thousands of items a second), and a stall would look like it had just moved.
# Lines carry no time of their own, so each is dated by its place in the log, between the last
# event the old daemon stored (its offset and time) and the log's last modification: exact for
# the last line, and for the others as good as the job's output is steady.

# How long a re-adopted attempt's reading of its backlog may go without moving before it is judged
# anyway: reading takes well under a second even for megabytes, and is waited for as long as it
# moves (under load, slowly); this bounds a log that cannot be read to its end.
CATCH_UP_STILL_S = 5.0


@dataclass(frozen=True)
class Backlog:
    """Log bytes [start_offset, end_offset) of one generation, written from start_ts to end_ts
    (wall-clock times)."""

    generation: int
    start_offset: int
    start_ts: float
    end_offset: int
    end_ts: float

    def covers(self, offset: int, generation: int) -> bool:
        """Whether the record starting at ``offset`` was written before the attempt was adopted."""
        return generation == self.generation and offset < self.end_offset

    def wall_at(self, offset: int) -> float:
        """When the record at ``offset`` was written, by its place between the two ends."""
        span = self.end_offset - self.start_offset
        share = 1.0 if span <= 0 else min(1.0, max(0.0, (offset - self.start_offset) / span))
        return self.start_ts + share * (self.end_ts - self.start_ts)


@dataclass(frozen=True)
class CatchUp:
    """What the watch of a re-adopted attempt starts from.  Its deadlines may have passed while no
    daemon watched: it is judged at once, but only once its ``backlog`` is read (or once reading
    it has not moved since ``until``, a clock time: a log that cannot be read to its end).
    ``exited``: its command had ended by then (its exit status written): it is judged by that
    exit, once its log is read, never by a clock that ran while nobody could watch it."""

    backlog: Backlog | None
    until: float | None
    exited: bool = False


def backlog_of(generation: int, resume_offset: int, anchor: tuple[int, float], size: int, mtime: float,
               now: float) -> Backlog | None:
    """The backlog of a log of ``size`` bytes last modified at ``mtime``, read again from
    ``resume_offset``; ``anchor``: the (offset, wall time) of the latest record known to have been
    read before (the last stored event, else the start of the log and the attempt's start).
    None when nothing was written unread, or the times disagree (a clock set back)."""
    start_offset, start_ts = anchor
    if size <= resume_offset or start_offset > resume_offset or not start_ts <= mtime <= now:
        return None
    return Backlog(generation, start_offset, start_ts, size, mtime)
