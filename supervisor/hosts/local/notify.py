"""An attempt's ``NOTIFY_SOCKET``: the unix datagram socket systemd's ``sd_notify`` protocol
writes to, one per local attempt, so that a program's existing ``sd_notify`` calls
(``READY=1``, ``STATUS=…``, ``WATCHDOG=1``) reach the daemon.

Each datagram is newline-separated ``KEY=VALUE`` assignments (systemd's ``sd_notify(3)``);
those the daemon uses are parsed into a ``NotifyMessage``, the rest ignored.  The socket is read
by a reader callback on the loop with a budget: at most ``_PER_WAKE`` datagrams per wake and
``_PER_SECOND`` a second.  Past the budget the reader pauses until the next second, so a program
that floods the socket costs the daemon a bounded share of its loop: the kernel's queue holds
the rest, and a sender finds it full (systemd's own socket does the same).

Local only: a program on another host has no path to this socket (docs/guides/verdicts.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_MAX_DATAGRAM = 4096  # systemd reads 4 KiB too; more is cut, never a larger buffer per message
_PER_WAKE = 64
_PER_SECOND = 1000
STATUS_MAX_CHARS = 200  # a status line is one line of `status`, not a log
_SUN_PATH_MAX = 107  # sockaddr_un's 108 bytes, less the terminating NUL


@dataclass(frozen=True, slots=True)
class NotifyMessage:
    """What one datagram said, of what the daemon uses."""

    ready: bool = False
    watchdog: bool = False
    status: str | None = None  # None: no STATUS= in it
    stopping: bool = False


def parse(datagram: bytes) -> NotifyMessage:
    """One datagram's assignments; unknown keys and malformed lines are ignored (systemd logs and
    drops them)."""
    ready = watchdog = stopping = False
    status: str | None = None
    for line in datagram[:_MAX_DATAGRAM].decode("utf-8", "replace").split("\n"):
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "READY" and value == "1":
            ready = True
        elif key == "WATCHDOG" and value == "1":
            watchdog = True
        elif key == "STOPPING" and value == "1":
            stopping = True
        elif key == "STATUS":
            # One printable line: a status that moved the terminal's cursor would garble `status`.
            status = "".join(ch if ch.isprintable() else " " for ch in value)[:STATUS_MAX_CHARS].strip()
    return NotifyMessage(ready=ready, watchdog=watchdog, status=status, stopping=stopping)


def notify_address(directory: Path, tag: str) -> str:
    """The socket's address for attempt ``tag``: a path under ``directory`` (the state
    directory's ``notify/``), or, should that be too long for a unix socket, an abstract
    address (``@…``, which ``sd_notify`` and its Python ports understand)."""
    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    path = str(directory / digest)
    return path if len(path.encode()) <= _SUN_PATH_MAX else f"@supervise/{digest}"


class NotifySocket:
    """One attempt's bound socket.  ``start()`` hands each datagram's message to a callback on the
    loop; ``close()`` stops reading and removes the socket's file."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[NotifyMessage], None] | None = None
        self._second = 0  # the whole second the budget counts in
        self._in_second = 0
        self._paused: asyncio.TimerHandle | None = None
        self.received = 0
        self.paused_times = 0  # how often the budget paused reading (a flooding sender)
        try:
            if address.startswith("@"):
                self._sock.bind("\0" + address[1:])
            else:
                path = Path(address)
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # this attempt's, left by a daemon that died: bound again here
                self._sock.bind(address)
                os.chmod(address, 0o600)  # only the user's own processes may speak for the attempt
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise

    def start(self, on_message: Callable[[NotifyMessage], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def _readable(self) -> None:
        assert self._loop is not None and self._on_message is not None
        for _ in range(_PER_WAKE):
            now = int(time.monotonic())
            if now != self._second:
                self._second, self._in_second = now, 0
            if self._in_second >= _PER_SECOND:
                # Over budget: not read again before the next second; the kernel's queue holds the rest.
                self._loop.remove_reader(self._sock.fileno())
                self.paused_times += 1
                self._paused = self._loop.call_later(now + 1 - time.monotonic(), self._resume)
                return
            try:
                datagram = self._sock.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # a closed socket: close() removes the reader
            self._in_second += 1
            self.received += 1
            self._on_message(parse(datagram))

    def _resume(self) -> None:
        self._paused = None
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def close(self) -> None:
        """Idempotent: the watch closes it, and the runner again should the watch never have begun."""
        if self._sock.fileno() < 0:
            return
        if self._paused is not None:
            self._paused.cancel()
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        if not self.address.startswith("@"):
            with contextlib.suppress(OSError):
                os.unlink(self.address)
