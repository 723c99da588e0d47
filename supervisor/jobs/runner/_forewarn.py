"""The first signal before a kill (supervisor/jobs/forewarn.py), said in the attempt's journal."""

from __future__ import annotations

from supervisor.hosts.base import Host, ProcessHandle
from supervisor.jobs.forewarn import forewarn as send_first_signal
from supervisor.jobs.runner._journal import Journal
from supervisor.spec.model import JobSpec


async def forewarn(spec: JobSpec, host: Host, handle: ProcessHandle, journal: Journal, n: int) -> None:
    """Send the spec's first signal and wait for the program; said in the attempt's events."""
    done = await send_first_signal(spec, host, handle)
    if done is not None:
        journal.action(n, done.message, done.data)
