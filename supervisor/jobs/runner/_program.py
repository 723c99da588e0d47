"""The program an attempt runs, as opposed to the wrapper shell that launched it (and stays to
record its exit): the pid `status` shows and a user would `kill`, `py-spy` or `nvidia-smi` for.
Learned once, shortly after the launch (or a re-adoption), from the host's process table."""

from __future__ import annotations

import asyncio

from supervisor.core.errors import SuperviseError
from supervisor.hosts.base import ProgramFinder
from supervisor.jobs.runner._context import Live

_TRIES = 40
_EVERY_S = 0.25  # the wrapper starts its child within milliseconds; a loaded box may take longer


async def learn_program_pid(host: object, live: Live) -> None:
    """Sets ``live.program_pid`` once the wrapper's child is seen (gives up after ~10 s, or when the
    attempt ends first, or on a host that cannot tell)."""
    if not isinstance(host, ProgramFinder):
        return
    for _ in range(_TRIES):
        if live.exit_status is not None:
            return
        try:
            pid = await host.program_pid(live.handle)
        except (SuperviseError, OSError):
            pid = None
        if pid is not None:
            live.program_pid = pid
            return
        await asyncio.sleep(_EVERY_S)
