"""Attempts a batch scheduler holds: the wait in its queue, and its word on how they ended.

While a scheduler (Slurm) keeps an attempt PENDING there is no process and no output: the
attempt is never judged stalled or silent then.  The job shows WAITING with the scheduler's
reason (Resources, Priority, JobHeldUser, ...), and the watchdog starts when the attempt does.
When the scheduler says what ended an attempt (preempted, its time limit, its memory limit),
that is the verdict: the exit code alone would read as a crash.
"""

from __future__ import annotations

import asyncio

import structlog

from supervisor.core.errors import SuperviseError
from supervisor.core.events import JobState, Verdict
from supervisor.core.payloads import ActionData
from supervisor.core.tasks import set_within
from supervisor.hosts.base import ExitStatus, Host, QueuedHost, SchedulerEnd
from supervisor.jobs.runner._context import Live
from supervisor.jobs.runner._journal import Journal
from supervisor.watchdog import Judgement

log = structlog.get_logger("supervise.runner")

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
                live.watchdog = live.watchdog.anew()
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
    evidence = {"scheduler_end": status.scheduler_end.value, "returncode": status.returncode, "signal": status.signal}
    return Judgement(_VERDICTS[status.scheduler_end], status.describe(), evidence)
