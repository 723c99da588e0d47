"""An attempt whose host cannot be reached: a host that cannot be reached (a link down past its
retries, a changed host key, a refused login) says nothing of the process running there, so its
attempt waits for the host, not ended.  The job reads ``unreachable`` (alerted), and the host is
asked again, with backoff, until it answers (the runner then re-adopts the attempt) or the user
stops the job."""

from __future__ import annotations

import asyncio

from supervisor.core.errors import ConnectionLost, HostRefused
from supervisor.core.events import JobState
from supervisor.core.payloads import ActionData
from supervisor.core.tasks import set_within
from supervisor.hosts.base import Host
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices

UNREACHABLE = (ConnectionLost, HostRefused)
_REACH_AGAIN_S = (2.0, 30.0)  # the first wait before asking the host again, and the longest


async def wait_for_host(host: Host, live: Live, exc: Exception, journal: Journal, alerts: Alerts,
                        stopped: asyncio.Event) -> bool:
    """True once ``host`` answers again about ``live``'s process; False when ``stopped`` came first."""
    n, where = live.row.n, host.name
    journal.action(n, f"{where} unreachable: {exc}; attempt {n} is not known to have ended, waiting for the host",
                   ActionData(error=str(exc)))
    journal.set_job(JobState.UNREACHABLE, f"attempt {n}: {exc}; re-adopted when the host answers")
    alerts.send_soon(live, notices.unreachable(alerts.about(live), where, str(exc)))
    wait, said = _REACH_AGAIN_S[0], str(exc)
    while True:
        if await set_within(stopped, wait):
            # The attempt stays `running` in the store (nothing says it ended): a later `stop`,
            # once the host answers, finds it and kills it; a restarted daemon re-adopts it.
            journal.set_job(JobState.STOPPED, f"stopped by user while {where} was unreachable: attempt {n} "
                                              f"(pid {live.row.pid}) may still run there; `supervise stop {journal.job}` "
                                              "again once the host answers ends it")
            return False
        try:
            await host.is_alive(live.handle)
            return True
        except UNREACHABLE as again:
            wait = min(wait * 2, _REACH_AGAIN_S[1])
            if str(again) != said:  # a different refusal (the key fixed, the login not yet): say it
                said = str(again)
                journal.set_job(JobState.UNREACHABLE, f"attempt {n}: {again}; re-adopted when the host answers")
