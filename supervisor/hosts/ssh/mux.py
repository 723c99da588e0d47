"""One channel per SSH host for all of its log follows and exit watches (see ``mux_agent``).

``SshMux`` keeps the agent's channel up while anyone uses it: it starts the agent, reads its
events and hands each to its subscriber (a follower's queue, an exit waiter's future).  When
the channel or the connection drops, every follower is told (``Dropped``: it asks again from
the end of its last record) and every exit watch is sent again on the next channel; when the
connection cannot be remade within ``REACH_S``, every follower and exit watch is told the box
cannot be reached (``ConnectionLost``), and their attempts wait for it unjudged.  Once the
agent has said hello its channel stays up until the host closes or the channel drops: a job's
launch checks it first (``ready``) and its follow comes a moment later.  Where the agent cannot
start (no python3 on the box, ``SUPERVISE_SSH_PYTHON`` not runnable or too old), every use fails
with a ``HostError`` whose one line says what to do; the next use asks the box again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.core.errors import ConnectionLost, HostError, SuperviseError
from supervisor.core.tasks import cancel_and_wait
from supervisor.hosts import _remote
from supervisor.hosts._asyncssh import asyncssh
from supervisor.hosts.ssh.agent import _close_process
from supervisor.hosts.ssh.connection import _CHANNEL, _DROPS, SshConnection
from supervisor.hosts.ssh.mux_agent import (
    MUX_SH,
    AskStats,
    Data,
    Ended,
    Event,
    Follow,
    Gone,
    NoAgent,
    ProtocolError,
    Request,
    Reset,
    Started,
    Stats,
    Stop,
    Watch,
    agent_source,
    parse_event,
    parse_hello,
)

log = structlog.get_logger("supervise.ssh")
_AGENT_ERRORS: tuple[type[BaseException], ...] = (*_DROPS, ProtocolError)
# How long the agent's channel may take to come back (the connection remade) before the attempts
# followed and watched there are told the box cannot be reached: a dropped connection that is
# remade at once (sshd restarted, a NAT's hiccup) is no outage.
REACH_S = 5.0


@dataclass(frozen=True)
class Dropped:
    """The channel went away under a follow: ask again (or give up with ``fatal``)."""

    error: str
    fatal: SuperviseError | None = None


FollowEvent = Started | Data | Reset | Ended | Dropped


class SshMux:
    """The host's multiplexed channel; see the module docstring."""

    def __init__(self, host: SshConnection, python: str = "python3") -> None:
        self._host = host
        self._python = python
        self._ids = itertools.count(1)
        self._subs: dict[int, asyncio.Queue[FollowEvent]] = {}
        self._watches: dict[str, set[asyncio.Future[None]]] = {}
        self._stats: list[asyncio.Future[Stats]] = []
        # Uses waiting for the agent to be up: a launch's (``ready``), which waits through an outage,
        # and a follow's (``subscribe``), which is told when the box cannot be reached.
        self._ready: list[asyncio.Future[None]] = []
        self._subscribing: list[asyncio.Future[None]] = []
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.channels = 0  # agent channels started, the first included

    @property
    def python(self) -> str:
        """The command that runs the agent on the box (SUPERVISE_SSH_PYTHON, else python3)."""
        return self._python

    # -- users ------------------------------------------------------------------------------

    async def ready(self) -> None:
        """Once the agent runs on the box (started if need be); a ``HostError`` saying what to
        do when it cannot start there."""
        await self._until_up(self._ready)

    async def _until_up(self, waiters: list[asyncio.Future[None]]) -> None:
        if self._up.is_set():
            return
        if self._closed:
            raise HostError(f"the SSH host {self._host.target.display} was closed")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(future)
        self._ensure_running()
        try:
            await future
        finally:
            if future in waiters:
                waiters.remove(future)

    async def subscribe(self, path: str, offset: int, *, drain: bool) -> tuple[int, asyncio.Queue[FollowEvent]]:
        """Follow (or drain once) ``path`` from ``offset``; events arrive on the queue."""
        sub_id = next(self._ids)
        queue: asyncio.Queue[FollowEvent] = asyncio.Queue()
        self._subs[sub_id] = queue
        try:
            await self._until_up(self._subscribing)
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        self._send(Follow(sub_id, path, offset, drain))
        return sub_id, queue

    def unsubscribe(self, sub_id: int) -> None:
        if self._subs.pop(sub_id, None) is not None and self._up.is_set():
            self._send(Stop(sub_id))

    async def watch(self, key: str) -> None:
        """Until the process ``key`` ("pid:start") has ended."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group = self._watches.setdefault(key, set())
        first = not group
        group.add(future)
        self._ensure_running()
        if first and self._up.is_set():
            self._send(Watch(key))
        try:
            await future
        finally:
            group = self._watches.get(key, set())
            group.discard(future)
            if not group:
                self._watches.pop(key, None)

    async def stats(self) -> Stats:
        """What the agent serves right now (follows, watches): for tests and benchmarks."""
        await self.ready()
        future: asyncio.Future[Stats] = asyncio.get_running_loop().create_future()
        self._stats.append(future)
        self._send(AskStats())
        return await future

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        for waiting in self._ready + self._subscribing:  # a launch waiting for the agent is told, not left waiting forever
            if not waiting.done():
                waiting.set_exception(HostError(f"the SSH host {self._host.target.display} was closed"))

    # -- the channel --------------------------------------------------------------------------

    def _send(self, request: Request) -> None:
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(Exception):  # a dead channel: the reader notices and tells everyone
                proc.stdin.write(request.line())

    def _ensure_running(self) -> None:
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name=f"ssh-mux:{self._host.name}")

    def _wanted(self) -> bool:
        return bool(self._subs or self._watches or self._stats or self._ready or self._subscribing)

    async def _run(self) -> None:
        failures = 0
        while self._wanted() and not self._closed:
            proc = None
            try:
                proc = await self._host.stream(MUX_SH, self._python, agent_source(),
                                               reach_by=time.monotonic() + REACH_S)
                await self._hello(proc)
                self.channels += 1
                failures = 0
                self._proc = proc
                for key in self._watches:
                    self._send(Watch(key))
                self._up.set()
                for future in self._ready + self._subscribing:
                    if not future.done():
                        future.set_result(None)
                await self._serve(proc)
            except ConnectionLost as exc:
                # The box does not answer: what is followed or watched there cannot be, for now.
                # Their users are told (an attempt reads `unreachable` and is not judged until it
                # can be read again); a launch waiting for the agent keeps waiting.
                log.warning("the host cannot be reached", host=self._host.name, error=str(exc))
                self._out_of_reach(exc)
                continue
            except SuperviseError as exc:
                log.warning("the remote agent cannot run", host=self._host.name, error=str(exc))
                self._fail_all(exc)
                continue  # ends here, unless a use came while this channel closed: the box is asked again
            except _AGENT_ERRORS as exc:
                self._host.note_drop(exc)
                failures += 1
                log.info("the remote agent's channel dropped", host=self._host.name, error=str(exc) or type(exc).__name__)
            finally:
                self._up.clear()
                self._proc = None
                self._tell_dropped(proc)
                await _close_process(proc)
            if failures:
                await asyncio.sleep(_CHANNEL.wait(failures))

    async def _hello(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        """Skip to the script's marker; then the agent's hello, or why it cannot start (a HostError)."""
        while (line := await proc.stdout.readline()) and line.rstrip(b"\n") != _remote.MARK:
            pass
        line = await proc.stdout.readline()
        if not line:
            raise EOFError("the remote agent ended before it said hello")
        answer = parse_hello(line)
        if isinstance(answer, NoAgent):
            raise HostError(answer.message(self._python, self._host.target.display))

    async def _serve(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise EOFError("the remote agent ended")
            event = parse_event(line)
            if isinstance(event, Data):
                event = Data(event.id, event.size, await proc.stdout.readexactly(event.size))
            self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Gone):
            for future in self._watches.pop(event.key, set()):
                if not future.done():
                    future.set_result(None)
        elif isinstance(event, Stats):
            while self._stats:
                asked = self._stats.pop(0)
                if not asked.done():
                    asked.set_result(event)
        elif isinstance(event, (Started, Data, Reset, Ended)):
            queue = self._subs.get(event.id)
            if queue is not None:
                queue.put_nowait(event)

    def _tell_dropped(self, proc: asyncssh.SSHClientProcess[bytes] | None) -> None:
        if proc is None:
            return
        for queue in self._subs.values():
            queue.put_nowait(Dropped("the remote agent's channel dropped"))

    def _out_of_reach(self, exc: ConnectionLost) -> None:
        """Tell every follow and exit watch that the box cannot be reached; each is forgotten (its
        user asks again once the box answers)."""
        self._fail_follows_and_watches(exc)

    def _fail_all(self, exc: SuperviseError) -> None:
        """Tell every use waiting on the agent that it cannot run; each is then forgotten, so that
        only uses that come later ask the box again."""
        self._fail_follows_and_watches(exc)
        waiting: list[asyncio.Future[Any]] = [*self._stats, *self._ready]
        for future in waiting:
            if not future.done():
                future.set_exception(exc)
        self._stats.clear()
        self._ready.clear()

    def _fail_follows_and_watches(self, exc: SuperviseError) -> None:
        for group in self._watches.values():
            for future in group:
                if not future.done():
                    future.set_exception(exc)
        for queue in self._subs.values():
            queue.put_nowait(Dropped(str(exc), exc))
        for waiting in self._subscribing:
            if not waiting.done():
                waiting.set_exception(exc)
        self._watches.clear()
        self._subs.clear()
        self._subscribing.clear()
        self._subscribing.clear()
