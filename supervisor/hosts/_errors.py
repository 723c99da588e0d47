"""How SSH failures read: one classifier from asyncssh's and the OS's exceptions to ours.

``ssh_errors(where)`` wraps anything that opens or uses a connection to a remote box.  What
leaves it is a ``SuperviseError`` with one line that names the address:
    ``HostError``       retrying will not cure it (a name that does not resolve, a client
                        setup problem: a key that does not load, a bad ssh config);
    ``ConnectionLost``  the link is down, refused or timed out: the caller may retry,
                        e.g. "connection refused (nobody@127.0.0.1:1)".
Host-key and login refusals need the connection's own details to explain: the SSH host
turns those into its own ``HostError`` inside this context.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from supervisor.core.errors import ConnectionLost, HostError, SuperviseError
from supervisor.hosts._asyncssh import asyncssh

# asyncio's message when every address of a name failed: "Multiple exceptions: [Errno 111] ..., [Errno 111] ..."
_ERRNO = re.compile(r"\[Errno (\d+)\]")
_SETUP_ERRORS = (asyncssh.KeyImportError, asyncssh.KeyEncryptionError, asyncssh.ConfigParseError, ValueError)
_LINK_ERRORS = (OSError, asyncssh.Error, TimeoutError, EOFError, asyncio.IncompleteReadError)


def describe(exc: BaseException) -> str:
    """A failure in a few words: 'connection refused', 'timed out', 'disconnected: ...'."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}" if exc.reason else "disconnected"
    if isinstance(exc, asyncssh.ChannelOpenError):
        return f"session refused: {exc.reason or exc}"
    if isinstance(exc, OSError):
        errnos = {exc.errno} if exc.errno else {int(n) for n in _ERRNO.findall(str(exc))}
        if len(errnos) == 1:
            return os.strerror(errnos.pop()).lower()
    return str(exc) or type(exc).__name__


@contextmanager
def ssh_errors(where: str) -> Iterator[None]:
    """Let only SuperviseErrors out, each one line naming ``where`` (``user@host:port``)."""
    try:
        yield
    except SuperviseError:
        raise
    except socket.gaierror as exc:
        raise HostError(f"cannot resolve the host name of {where}: {exc.strerror or exc}") from exc
    except _SETUP_ERRORS as exc:
        raise HostError(f"SSH client setup for {where} failed: {exc}") from exc
    except _LINK_ERRORS as exc:
        raise ConnectionLost(f"{describe(exc)} ({where})") from exc
