"""A runner's wait for the jobs its spec runs `after` (supervisor/jobs/dependencies.py): `waiting`
with the reason while they run, `cancelled` with an alert when one gave up."""

from __future__ import annotations

import asyncio
import time

from supervisor.core.events import EventKind, JobState
from supervisor.core.payloads import AlertData
from supervisor.core.tasks import set_within
from supervisor.jobs.dependencies import readiness
from supervisor.jobs.runner._journal import Journal
from supervisor.notify.alerts import Alert, Alerter
from supervisor.store.database import Store

POLL_S = 0.25  # the store is read, so a restarted daemon's runner asks the same question


async def wait_for_after(after: list[str], store: Store, journal: Journal, alerter: Alerter, stop: asyncio.Event) -> bool:
    """True once every job in ``after`` is done; False when cancelled or stopped (the job's state says which)."""
    shown = ""
    while True:
        state = readiness(store, after)
        if state.ready:
            return True
        if state.cancelled is not None:
            await _cancel(journal, alerter, state.cancelled)
            return False
        if state.waiting != shown:
            shown = state.waiting
            journal.set_job(JobState.WAITING, shown)
        if not await set_within(stop, POLL_S):
            continue
        journal.set_job(JobState.STOPPED, f"stopped by user while {shown}")
        return False


async def _cancel(journal: Journal, alerter: Alerter, why: str) -> None:
    name = journal.job
    reason = f"not launched: {why}"
    journal.set_job(JobState.CANCELLED, reason)
    # Attempt 0: nothing was launched; the event is kept (and shown by `events`) whether or not an
    # alert URL is configured.
    journal.record(0, EventKind.ALERT, f"{name}: cancelled", AlertData(evidence=reason, next="not launched"))
    await alerter.send(Alert(job=name, attempt=0, title=f"{name}: cancelled", what="cancelled", evidence=reason,
                             gpu="", next_action="not launched; start it again once the cause is fixed",
                             key=f"{name}:cancelled:{time.time():.0f}"))
