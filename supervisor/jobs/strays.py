"""Attempts alive that no runner watches, and stopping them.

A job's state can say it is over while one of its processes still runs: a runner that could
not be built on recovery (its probe pack gone), an older attempt found alive after a newer
one was launched, a runner that ended by a fault.  ``supervise stop`` must reach those too,
whatever the job's state says: every attempt of the job whose exit was never recorded and
whose process (pid and start time) is still there is killed, tree and all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from supervisor.core.actions import AttemptAction
from supervisor.core.events import AttemptState, Event, EventKind
from supervisor.core.payloads import ActionData
from supervisor.hosts.base import Host, KillReport, ProcessHandle
from supervisor.jobs.forewarn import forewarn
from supervisor.jobs.recorder import Recorder
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import FINAL_STATES, AttemptEnd, ExitCode
from supervisor.store.database import AttemptRow, Store

log = structlog.get_logger("supervise.strays")


@dataclass
class StrayStop:
    """What stopping the unwatched attempts of a job did."""

    attempts: list[int] = field(default_factory=list)  # the attempts found alive and stopped
    report: KillReport = field(default_factory=KillReport)


def stray_handle(row: AttemptRow) -> ProcessHandle:
    return ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                         tag=row.tag, log_path=row.log_path, status_path=row.status_path,
                         scheduler_id=row.scheduler_id)


async def alive_unwatched(store: Store, host: Host, job: str, watched: int | None) -> list[AttemptRow]:
    """The attempts of ``job`` other than ``watched`` whose exit was never recorded and whose
    process is still alive."""
    found = []
    for row in store.attempts(job):
        if row.n == watched or row.pid is None or row.exit_code is not None or row.exit_signal is not None:
            continue
        if row.host != host.name:  # a pid means something only on its own host (a sharded job has several)
            continue
        if await host.is_alive(stray_handle(row)):
            found.append(row)
    return found


async def stop_strays(recorder: Recorder, host: Host, spec: JobSpec, watched: int | None,
                      grace_s: float) -> StrayStop:
    """Kill every unwatched live attempt of the job and record it (attempt stopped, an event).
    A job that asked for a signal before any kill (`kill_signal_first`) gets it here too: an
    attempt nobody watched is still a trainer with a checkpoint to save."""
    result = StrayStop()
    store = recorder.store
    job = spec.name
    for row in await alive_unwatched(store, host, job, watched):
        handle = stray_handle(row)
        await _forewarn_stray(recorder, host, spec, handle, row.n)
        report = await host.kill_tree(handle, grace_s)
        status = await host.exit_status(handle)
        log.warning("stopped an attempt no runner watched", job=job, attempt=row.n, outcome=report.summary())
        told = Event(job=job, attempt=row.n, kind=EventKind.ACTION,
                     message=f"stopped by user (it was running unwatched): {report.summary()}",
                     data=ActionData(terminated=[p for p, _ in report.terminated],
                                     killed=[p for p, _ in report.killed],
                                     survivors=[p for p, _ in report.survivors]).to_json())
        if row.state in FINAL_STATES:  # its end is stored already (a survivor of its kill): the stop is told
            recorder.events([told])
        else:
            end = AttemptEnd(state=AttemptState.STOPPED, action=AttemptAction.stopped(),
                             reason="stopped by user; it was running unwatched",
                             exit=ExitCode(status.returncode, status.signal) if status else ExitCode(None, None))
            recorder.attempt_ended(job, row.n, end, told)
        result.attempts.append(row.n)
        merge_reports(result.report, report)
    return result


async def _forewarn_stray(recorder: Recorder, host: Host, spec: JobSpec, handle: ProcessHandle, n: int) -> None:
    done = await forewarn(spec, host, handle)
    if done is not None:
        recorder.events([Event(job=spec.name, attempt=n, kind=EventKind.ACTION,
                               message=f"{done.message} (it was running unwatched)", data=done.data.to_json())])


def merge_reports(into: KillReport, more: KillReport) -> None:
    into.terminated += more.terminated
    into.killed += more.killed
    into.survivors += more.survivors
    into.reparented += more.reparented
