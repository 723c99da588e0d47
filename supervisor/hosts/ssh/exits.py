"""Waiting for a remote host's attempts to exit: all waits on one channel."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncssh

from supervisor.core.errors import SuperviseError
from supervisor.core.tasks import cancel_and_wait
from supervisor.hosts import _remote
from supervisor.hosts.ssh.agent import _close_process
from supervisor.hosts.ssh.connection import _CHANNEL, _DROPS, SshConnection
from supervisor.hosts.ssh.mux import SshMux


class _ExitWatcher:
    """All of a host's exit waits on one channel: the agent's (ssh_mux) where the box runs it,
    else a channel of their own (see _remote.WATCH_EXITS for why it polls remotely), whose
    script is restarted with the new set when a wait is added; it reports each pid as it
    ends, and the waiters for it wake at once."""

    def __init__(self, host: SshConnection, mux: SshMux) -> None:
        self._host = host
        self._mux = mux
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, key: str) -> None:
        if await self._mux.usable():
            await self._mux.watch(key)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, set()).add(future)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"ssh-exits:{self._host.name}")
        try:
            await future
        finally:
            group = self._waiters.get(key)
            if group is not None:
                group.discard(future)
                if not group:
                    del self._waiters[key]

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        failures = 0
        while self._waiters:
            watched = set(self._waiters)
            self._changed.clear()
            proc = None
            try:
                proc = await self._host.stream(_remote.WATCH_EXITS, *sorted(watched))
                ended_cleanly = await self._serve(proc, watched)
                failures = 0 if ended_cleanly else failures + 1
            except SuperviseError as exc:
                for group in self._waiters.values():
                    for future in group:
                        if not future.done():
                            future.set_exception(exc)
                return
            except _DROPS as exc:
                self._host.note_drop(exc)
                failures += 1
            finally:
                await _close_process(proc)
            if failures:
                await asyncio.sleep(_CHANNEL.wait(failures))

    async def _serve(self, proc: asyncssh.SSHClientProcess[bytes], watched: set[str]) -> bool:
        """Read 'gone' lines until the wanted set outgrows the watched one (True) or the
        channel ends (False)."""
        reader: asyncio.Future[bytes] | None = None
        try:
            while self._waiters and set(self._waiters) <= watched:
                if reader is None:
                    reader = asyncio.ensure_future(proc.stdout.readline())
                changed: asyncio.Future[Any] = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait({reader, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if not reader.done():
                    self._changed.clear()
                    continue
                line = reader.result()
                reader = None
                if not line:
                    self._host.note_drop(EOFError("exit watcher ended"))
                    return False
                word, _, key = line.decode(errors="replace").strip().partition(" ")
                if word == "gone":
                    watched.discard(key)
                    for future in self._waiters.pop(key, set()):
                        if not future.done():
                            future.set_result(None)
            return True
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
