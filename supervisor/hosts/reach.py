"""A quick look, before a job is started on a remote host, for the one answer retrying cannot
change soon: nothing listens at the address given.  The runner's connection retries for
SUPERVISE_SSH_RETRY_S (a host rebooting comes back); a typo in a port at `start` must be said
at once, in one line, not after that minute.

Which address to look at is each host kind's to say: its reach hook, registered with the kind in
`hosts/registry.py` and imported only for a host of that kind.  This module knows no kind, so a daemon
with only local jobs loads no SSH client and no Slurm code through it (tests/test_install.py)."""

from __future__ import annotations

import asyncio
import contextlib

from supervisor.core.errors import ConnectionLost
from supervisor.hosts.registry import reach_hook

_PROBE_TIMEOUT_S = 3.0


async def refuse_if_nothing_listens(host: str) -> None:
    """ConnectionLost('connection refused (user@host:port)') when the port is closed; silent otherwise,
    and for a host whose kind names no address (local, `slurm:`, an SSH host without an explicit port)."""
    hook = reach_hook(host)
    address = hook(host) if hook is not None else None
    if address is None:
        return
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_connection(address.host, address.port)
    except ConnectionRefusedError:
        raise ConnectionLost(f"connection refused ({address.display})") from None
    except (OSError, TimeoutError):
        return  # unreachable for now, a name ssh config resolves: the runner's retries judge it
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
