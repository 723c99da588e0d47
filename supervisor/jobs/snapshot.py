"""What a job runner shows the rest of the daemon: one frozen value per read.

Readers (`status`, the metrics) get a `RunnerSnapshot` from `JobRunner.snapshot()` and never
reach into the runner's live handles or its watchdog: what they may rely on is exactly what
is named here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor.core import protocol
from supervisor.core.events import BoundKind, Phase
from supervisor.core.progress import BarProgress

if TYPE_CHECKING:
    from supervisor.watchdog import BoundSource, Watchdog


@dataclass(frozen=True, slots=True)
class StallBound:
    """One watched bar's stall bound and where it came from."""

    bar: str
    bound_s: float
    in_s: float  # left of it if the bar does not move
    kind: BoundKind
    source: str  # as read: "history (n intervals from r runs)", "this run", "default floor", "first progress"
    history_intervals: int | None = None  # kind history: how many intervals, from how many runs
    history_runs: int | None = None


@dataclass(frozen=True, slots=True)
class RunnerSnapshot:
    job: str
    attempt: int | None  # the attempt being watched; None between attempts (backoff, waiting for GPUs)
    phase: Phase | None = None
    progress: BarProgress | None = None
    progress_still_s: float | None = None  # seconds since that bar last advanced (its ETA dates from then)
    last_output: float | None = None  # wall-clock time the attempt last wrote to its log
    still_for_s: float | None = None  # seconds since it last moved forward (a bar advanced, a phase began)
    next_verdict: protocol.NextVerdict | None = None  # the watchdog rule that comes due first if nothing changes
    stall_bounds: tuple[StallBound, ...] = ()
    next_relaunch_at: float | None = None  # wall-clock time of the next launch, during a backoff wait
    known_pids: frozenset[int] = frozenset()  # every pid the attempt was seen with (its tree, reparented workers)
    program_pid: int | None = None  # the program the attempt's wrapper runs, once seen
    status_line: str | None = None  # the latest STATUS= it sent to its NOTIFY_SOCKET
    paused: protocol.PausedInfo | None = None  # a wait it announces ("paused" lines): not progress, not a stall
    shard: int | None = None  # a shard's runner: its index (sharding.GATHER_SHARD for the gather step)
    shards: tuple[RunnerSnapshot, ...] = ()  # a sharded job: each shard's runner as it stands


def watching(job: str, attempt: int, watchdog: Watchdog, now: float, *, last_output: float | None,
             known_pids: frozenset[int], program_pid: int | None = None,
             status_line: str | None = None) -> RunnerSnapshot:
    """The snapshot of a runner watching `attempt`; ``now`` is the watchdog's clock."""
    bar = watchdog.progress
    moved = watchdog.phase_entered_at if bar is None else max(watchdog.phase_entered_at, bar.last_advance_at)
    first = watchdog.first_due(now)
    upcoming = None if first is None else protocol.NextVerdict(
        verdict=first.verdict, in_s=first.deadline - now, reason=first.describe(first.deadline)[0], bound_s=first.bound_s,
        bound_source=None if first.source is None else str(first.source))
    wait = watchdog.paused
    return RunnerSnapshot(
        paused=None if wait is None else protocol.PausedInfo(line=wait[1], for_s=max(0.0, now - wait[0])),
        job=job, attempt=attempt, phase=watchdog.phase,
        progress=None if bar is None else bar.standing(),
        progress_still_s=None if bar is None else max(0.0, now - bar.last_advance_at),
        last_output=last_output, still_for_s=max(0.0, now - moved),
        next_verdict=upcoming,
        stall_bounds=tuple(_stall_bound(*b) for b in watchdog.stall_bounds(now)),
        known_pids=known_pids, program_pid=program_pid, status_line=status_line,
    )


def _stall_bound(bar: str, bound_s: float, in_s: float, source: BoundSource) -> StallBound:
    history = source.kind is BoundKind.HISTORY
    return StallBound(bar, bound_s, in_s, source.kind, str(source), source.intervals if history else None,
                      source.runs if history else None)
