"""A sharded job as `status` shows it: one summary (shards done/running/failed, summed progress,
the ETA of the slowest running shard) and each shard's line, from the stored attempts of the
job's latest run and, where a runner watches, its shards' snapshots."""

from __future__ import annotations

import time
from collections.abc import Callable

from . import protocol
from .events import AttemptState, JobState, Verdict
from .snapshot import RunnerSnapshot
from .store import AttemptRow

_ENDED = {JobState.DONE, JobState.FAILED, JobState.STOPPED}


def shards_status(num_shards: int, job_state: JobState, attempts: list[AttemptRow], snapshot: RunnerSnapshot | None,
                  info: Callable[[AttemptRow], protocol.AttemptInfo]) -> protocol.ShardsStatus:
    sharded = [a for a in attempts if a.shard is not None]
    run = max((a.run for a in sharded), default=0)
    mine = [a for a in sharded if a.run == run]
    snapshots = {s.shard: s for s in snapshot.shards} if snapshot is not None else {}
    indices = list(range(num_shards)) + ([-1] if any(a.shard == -1 for a in mine) else [])
    shards = [_shard(i, [a for a in mine if a.shard == i], job_state, snapshots.get(i), info) for i in indices]
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


def _shard(index: int, rows: list[AttemptRow], job_state: JobState, snapshot: RunnerSnapshot | None,
           info: Callable[[AttemptRow], protocol.AttemptInfo]) -> protocol.ShardStatus:
    latest = rows[-1] if rows else None
    relaunch = None
    if snapshot is not None and snapshot.next_relaunch_at is not None:
        relaunch = max(0.0, snapshot.next_relaunch_at - time.time())
    return protocol.ShardStatus(shard=index, state=_state(latest, job_state), host=latest.host if latest else "-",
                                attempts=len(rows), attempt=info(latest) if latest else None,
                                next_relaunch_in_s=relaunch)


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
    if (latest.action or "").startswith("relaunch"):
        # A relaunch was due; if the job has ended since, it never came (stopped, or other shards failed).
        return JobState.BACKOFF if job_state not in _ENDED else JobState.STOPPED
    return JobState.FAILED
