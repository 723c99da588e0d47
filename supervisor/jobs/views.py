"""Saved state and runner snapshots → protocol models: what `status`, `attempts` and `events` show."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from supervisor.core import protocol
from supervisor.core.errors import SpecError
from supervisor.core.events import Event, EventKind
from supervisor.gpu.nvml import GpuSample
from supervisor.jobs.shard_views import shards_status
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.spec.model import JobSpec
from supervisor.store.database import AttemptRow, JobRow, Store


def attempt_info(row: AttemptRow) -> protocol.AttemptInfo:
    bar = row.progress
    progress = None if bar is None else protocol.ProgressInfo.of(bar, ended=not row.state.active)
    failure = protocol.FailureInfo.of(row.failure) if row.failure else None
    return protocol.AttemptInfo(
        job=row.job, n=row.n, state=row.state, host=row.host, pid=row.pid, started=row.started, ended=row.ended,
        exit_code=row.exit_code, exit_signal=row.exit_signal, log_path=row.log_path, phase=row.phase,
        progress=progress, verdict=row.verdict, reason=row.reason, failure=failure, fingerprint=row.fingerprint,
        action=row.action, argv=row.argv, run=row.run, run_attempt=row.run_attempt, shard=row.shard,
        usage=row.usage, checkpoint=row.checkpoint, params=row.params,
    )


def job_status(row: JobRow, store: Store, snapshot: RunnerSnapshot | None) -> protocol.JobStatus:
    """``snapshot``: the job's runner as it stands now (None when no runner watches the job)."""
    return _job_status(row, store, snapshot, store.latest_attempt(row.name))


def job_statuses(rows: Sequence[JobRow], store: Store,
                 snapshot: Callable[[str], RunnerSnapshot | None]) -> list[protocol.JobStatus]:
    """``job_status`` of each row, their latest attempts read in one query: `status` answers
    while busy logs are read, and each query it makes waits for the GIL once more."""
    if len(rows) == 1:  # one job's own attempt: no need to read every job's
        return [job_status(rows[0], store, snapshot(rows[0].name))]
    latest = store.latest_attempts() if rows else {}
    return [_job_status(row, store, snapshot(row.name), latest.get(row.name)) for row in rows]


def _job_status(row: JobRow, store: Store, snapshot: RunnerSnapshot | None,
                latest: AttemptRow | None) -> protocol.JobStatus:
    last_output_age = None
    next_relaunch = None
    next_verdict = None
    bounds: list[protocol.StallBoundInfo] = []
    if snapshot is not None:
        bounds = [protocol.StallBoundInfo(bar=b.bar, bound_s=b.bound_s, in_s=b.in_s, kind=b.kind, source=b.source,
                                          history_intervals=b.history_intervals, history_runs=b.history_runs)
                  for b in snapshot.stall_bounds]
        next_verdict = snapshot.next_verdict
        if snapshot.last_output is not None:
            last_output_age = time.time() - snapshot.last_output
        if snapshot.next_relaunch_at is not None:
            next_relaunch = max(0.0, snapshot.next_relaunch_at - time.time())
    attempt = attempt_info(latest) if latest else None
    if (attempt is not None and snapshot is not None and snapshot.attempt == attempt.n
            and snapshot.progress is not None):  # watched now: its bar as it stands now, its ETA counted down
        attempt.progress = protocol.ProgressInfo.watched(snapshot.progress, snapshot.progress_still_s)
    return protocol.JobStatus(outputs=_outputs(row.spec), stacks=_stacks_before_kill(store, latest),
        name=row.name, state=row.state, reason=row.reason, host=row.host, max_attempts=row.max_attempts,
        spec_error=row.spec_error,
        attempt=attempt,
        program_pid=snapshot.program_pid if snapshot is not None and latest is not None
        and snapshot.attempt == latest.n else None,
        status_line=snapshot.status_line if snapshot is not None and latest is not None
        and snapshot.attempt == latest.n else None,
        paused=snapshot.paused if snapshot is not None and latest is not None
        and snapshot.attempt == latest.n else None,
        last_output_age_s=last_output_age, stall_bounds=bounds, next_relaunch_in_s=next_relaunch, next_verdict=next_verdict,
        shards=(shards_status(row.shards, row.state, store.attempts(row.name), snapshot, attempt_info)
                if row.shards > 1 else None),
    )


def _stacks_before_kill(store: Store, latest: AttemptRow | None) -> str | None:
    """What the stacks event of a judged attempt said (one indexed read, only for those)."""
    if latest is None or latest.verdict is None or latest.verdict in ("done", "healthy"):
        return None
    found = store.events(latest.job, attempt=latest.n, kinds=[EventKind.STACKS.value], limit=1, latest=True)
    return found[0].message if found else None


def _outputs(spec: JobSpec | None) -> list[str]:
    if spec is None or not spec.outputs:  # a spec that no longer validates: no outputs to show
        return []
    try:
        return spec.output_paths()
    except SpecError:
        return []


def event_info(event: Event) -> protocol.EventInfo:
    return protocol.EventInfo(
        id=event.id or 0, job=event.job, attempt=event.attempt, ts=event.ts, kind=event.kind,
        probe=event.probe, phase=event.phase, offset=event.offset, message=event.message, data=event.data,
        failure=protocol.FailureInfo.of(event.failure) if event.failure else None,
    )


def gpu_devices(sample: GpuSample | None) -> list[protocol.GpuDeviceInfo]:
    if sample is None or not sample.available:
        return []
    devices = []
    for d in sample.devices:
        procs = [{"pid": p.pid, "used_mib": p.used_mib} for p in sample.processes if p.gpu_index == d.index]
        devices.append(protocol.GpuDeviceInfo(index=d.index, name=d.name, used_mib=d.used_mib,
                                              total_mib=d.total_mib, util_pct=d.util_pct, temperature_c=d.temperature_c,
                                              power_w=d.power_w, processes=procs))
    return devices
