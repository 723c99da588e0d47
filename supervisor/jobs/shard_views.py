"""A sharded job as `status` and the metrics show it: one summary (shards done/running/failed,
summed progress, the ETA of the slowest running shard) and each shard's line, from the stored
attempts of the job's latest run and, where a runner watches, its shards' snapshots."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.core import protocol
from supervisor.core.actions import ActionKind
from supervisor.core.events import AttemptState, JobState, Verdict
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.store.database import AttemptRow

_ENDED = {JobState.DONE, JobState.FAILED, JobState.STOPPED}
GATHER = -1  # the gather step's shard index (sharding.GATHER_SHARD; sharding imports the runners)


@dataclass(frozen=True, slots=True)
class ShardRows:
    """One shard in the job's latest run: its state, read from its attempts there."""

    shard: int
    state: JobState
    rows: tuple[AttemptRow, ...]  # its attempts in the run, oldest first

    @property
    def latest(self) -> AttemptRow | None:
        return self.rows[-1] if self.rows else None


def shard_rows(num_shards: int, job_state: JobState, attempts: list[AttemptRow]) -> list[ShardRows]:
    """Every shard 0..N-1 of the latest run, then the gather step once it has an attempt there."""
    sharded = [a for a in attempts if a.shard is not None]
    run = max((a.run for a in sharded), default=0)
    mine = [a for a in sharded if a.run == run]
    indices = list(range(num_shards)) + ([GATHER] if any(a.shard == GATHER for a in mine) else [])
    result = []
    for index in indices:
        rows = tuple(a for a in mine if a.shard == index)
        result.append(ShardRows(index, _state(rows[-1] if rows else None, job_state), rows))
    return result


def shards_status(num_shards: int, job_state: JobState, attempts: list[AttemptRow], snapshot: RunnerSnapshot | None,
                  info: Callable[[AttemptRow], protocol.AttemptInfo]) -> protocol.ShardsStatus:
    snapshots = {s.shard: s for s in snapshot.shards} if snapshot is not None else {}
    shards = [_shard(s, snapshots.get(s.shard), info) for s in shard_rows(num_shards, job_state, attempts)]
    real = [s for s in shards if s.shard >= 0]
    progress = [s.attempt.progress for s in real if s.attempt is not None and s.attempt.progress is not None]
    etas = [p.eta_s for s in real if s.state is JobState.RUNNING and s.attempt and (p := s.attempt.progress) and p.eta_s]
    totals = [p.total for p in progress if p.total is not None]
    return protocol.ShardsStatus(
        total=num_shards, done=sum(s.state is JobState.DONE for s in real),
        running=sum(s.state in (JobState.RUNNING, JobState.BACKOFF, JobState.WAITING) for s in real),
        failed=sum(s.state is JobState.FAILED for s in real),
        progress_done=sum(p.done for p in progress) if progress else None,
        progress_total=sum(totals) if totals else None, eta_s=max(etas) if etas else None, shards=shards)


def _shard(shard: ShardRows, snapshot: RunnerSnapshot | None,
           info: Callable[[AttemptRow], protocol.AttemptInfo]) -> protocol.ShardStatus:
    latest = shard.latest
    relaunch = next_verdict = output_age = None
    # The shard runner's word counts only while it watches the shard's latest attempt.
    watching = snapshot is not None and latest is not None and snapshot.attempt == latest.n
    if snapshot is not None and snapshot.next_relaunch_at is not None:
        relaunch = max(0.0, snapshot.next_relaunch_at - time.time())
    if watching and snapshot is not None:
        next_verdict = snapshot.next_verdict
        if snapshot.last_output is not None:
            output_age = max(0.0, time.time() - snapshot.last_output)
    attempt = info(latest) if latest else None
    if attempt is not None and watching and snapshot is not None and (bar := snapshot.progress) is not None:
        attempt.progress = protocol.ProgressInfo.watched(bar, snapshot.progress_still_s)
    return protocol.ShardStatus(shard=shard.shard, state=shard.state, host=latest.host if latest else "-",
                                attempts=len(shard.rows), attempt=attempt, next_relaunch_in_s=relaunch,
                                next_verdict=next_verdict, last_output_age_s=output_age)


def _state(latest: AttemptRow | None, job_state: JobState) -> JobState:
    """The shard's state, read from its latest attempt (the runner's word is the job's, not the shard's)."""
    if latest is None:
        return JobState.STARTING if job_state not in _ENDED else job_state
    if latest.state.active:
        return JobState.RUNNING
    if latest.verdict is Verdict.DONE:
        return JobState.DONE
    if latest.state is AttemptState.STOPPED:
        return JobState.STOPPED
    if latest.action_kind is ActionKind.RELAUNCH:
        # A relaunch was due; if the job has ended since, it never came (stopped, or other shards failed).
        return JobState.BACKOFF if job_state not in _ENDED else JobState.STOPPED
    return JobState.FAILED
