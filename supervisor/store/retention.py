"""Attempt-log retention: which old logs of a job to delete, and deleting them.

Every attempt writes its own log (never overwritten), so a job relaunching for days fills the
disk.  Per job, the newest `log_keep_attempts` logs are kept, and older ones go until the job's
logs fit in `log_max_bytes` (0: no byte limit).  The log of an attempt that is still running is
never deleted, whatever the limits say.  Only logs on this machine are pruned: a remote host's
logs are its own.  The attempts stay in the store, and so do their launch, exit, verdict, action,
failure and alert events; the progress and metric events read from a log go with it
(``prune_events``): the bulk of an attempt's history, only worth keeping while its log is there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.events import EventKind
from supervisor.core.host_url import is_local
from supervisor.store import arrivals
from supervisor.store.database import AttemptRow, Store

# The events that go with their attempt's log: each bar's steps and each metric line.
PRUNED_KINDS = (EventKind.PROGRESS.value, EventKind.METRIC.value)


@dataclass(frozen=True)
class Retention:
    keep_attempts: int
    max_bytes: int  # 0: no limit


@dataclass(frozen=True)
class PrunedFile:
    job: str
    attempt: int
    path: str
    size: int


def select_for_pruning(attempts: Iterable[AttemptRow], sizes: dict[str, int], rule: Retention) -> list[AttemptRow]:
    """The attempts whose logs go: newest first, a log is kept while within both limits; an
    active attempt is always kept (and counts against the limits, since it stays)."""
    doomed: list[AttemptRow] = []
    kept = 0
    kept_bytes = 0
    for row in sorted(attempts, key=lambda a: a.n, reverse=True):
        size = max(0, sizes.get(row.log_path, 0))
        within = kept < rule.keep_attempts and (rule.max_bytes == 0 or kept_bytes + size <= rule.max_bytes)
        if row.state.active or within:
            kept += 1
            kept_bytes += size
        else:
            doomed.append(row)
    return doomed


def prune_logs(attempts: list[AttemptRow], rule: Retention) -> list[PrunedFile]:
    """Delete the local log files `select_for_pruning` picks; returns what was deleted."""
    local = [a for a in attempts if is_local(a.host)]
    sizes = {a.log_path: _size(a.log_path) for a in local}
    removed = []
    for row in select_for_pruning(local, sizes, rule):
        if sizes[row.log_path] < 0:
            continue  # already gone
        removed.append(PrunedFile(row.job, row.n, row.log_path, sizes[row.log_path]))
        _unlink(row.log_path)
    return removed


def prune_events(store: Store, pruned: Iterable[PrunedFile]) -> int:
    """Delete the progress and metric events of the attempts whose logs were pruned; how many went."""
    by_job: dict[str, list[int]] = {}
    for p in pruned:
        by_job.setdefault(p.job, []).append(p.attempt)
    return sum(store.delete_events(job, attempts, PRUNED_KINDS) for job, attempts in by_job.items())


def remove_logs(attempts: list[AttemptRow]) -> list[str]:
    """Delete every local log of a job being forgotten; returns the paths deleted."""
    local = [a for a in attempts if is_local(a.host)]
    removed = [a.log_path for a in local if _size(a.log_path) >= 0]
    for row in local:
        _unlink(row.log_path)
        _unlink(row.status_path)  # the exit-status file: nothing reads it once the job is forgotten
    return removed


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def prune_arrivals(attempts: list[AttemptRow], rule: Retention, pruned: list[PrunedFile], root: Path) -> None:
    """The arrival marks (arrivals.py) go with their logs; a remote attempt's, whose log is the
    box's own, go once it is older than the last ``keep_attempts`` of its job."""
    by_count = select_for_pruning(attempts, {}, Retention(rule.keep_attempts, 0))
    arrivals.forget(root, {(p.job, p.attempt) for p in pruned} | {(a.job, a.n) for a in by_count})
