"""A quick look, before a job is started on an SSH host, for the one answer retrying cannot
change soon: nothing listens at the address given.  The runner's connection retries for
SUPERVISE_SSH_RETRY_S (a host rebooting comes back); a typo in a port at `start` must be said
at once, in one line, not after that minute."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

from supervisor.core.errors import ConnectionLost

_PROBE_TIMEOUT_S = 3.0


async def refuse_if_nothing_listens(host: str) -> None:
    """ConnectionLost('connection refused (user@host:port)') when the port is closed; silent otherwise.
    Only an explicit port is tried: without one, the user's ssh config may name another."""
    scheme = urlsplit(host).scheme
    if scheme == "slurm+ssh":
        host = "ssh" + host[len(scheme):]  # the login node's address
    elif scheme != "ssh":
        return
    # Imported here: the SSH client (asyncssh, a third of a second) is loaded only by a daemon whose specs name
    # an SSH host, never by one with only local jobs.
    from supervisor.hosts.ssh.target import parse_target

    target = parse_target(host)
    if target.port is None:
        return
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_connection(target.host, target.port)
    except ConnectionRefusedError:
        raise ConnectionLost(f"connection refused ({target.display})") from None
    except (OSError, TimeoutError):
        return  # unreachable for now, a name ssh config resolves: the runner's retries judge it
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
