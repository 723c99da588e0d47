"""One SSH connection per host, remade after a drop, with the channels multiplexed on it.

``SshConnection`` connects (keys, agent and ~/.ssh/config as OpenSSH would, host keys per
``target``), reconnects with tenacity's waits, runs short scripts in a resident shell per
lane (``agent``), gives slow ones a channel of their own, and starts long-lived scripts
(``stream``) for the remote agent that follows the logs and watches the exits.  ``SshHost`` (ssh/host.py) builds on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import tenacity

from supervisor.core.backoff import Backoff
from supervisor.core.errors import ConnectionLost, HostError, HostRefused
from supervisor.hosts import _remote
from supervisor.hosts._asyncssh import asyncssh
from supervisor.hosts._errors import ssh_errors
from supervisor.hosts.base import ELSEWHERE
from supervisor.hosts.ssh.agent import _SHELL, _Agent
from supervisor.hosts.ssh.target import (
    _TRUE,
    ENV_ACCEPT_NEW,
    ENV_CONFIG,
    ENV_KEY,
    ENV_KNOWN_HOSTS,
    ENV_RETRY_S,
    _Client,
    _paths,
    parse_target,
)

log = structlog.get_logger("supervise.ssh")

# How a channel fails: a dropped connection, a refused session, a remote script that ended.
_DROPS: tuple[type[BaseException], ...] = (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError,
                                           asyncio.IncompleteReadError, EOFError)
# Waits between tries: reconnecting (0.25 s doubling to 10 s, jittered), a refused session
# (0.1 s doubling to 1 s: short ones end soon), a channel that dropped (0.1 s doubling to 2 s).
_RECONNECT = Backoff(initial_s=0.25, max_s=10.0, jitter_s=0.25)
_SESSION = Backoff(initial_s=0.1, max_s=1.0)
_CHANNEL = Backoff(initial_s=0.1, max_s=2.0)


class SshConnection:
    """The connection to one SSH host, made on first use and remade after a drop."""

    def __init__(self, url: str, *, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.name = url
        self.capabilities = ELSEWHERE
        self.target = parse_target(url)
        self._config = _paths(env.get(ENV_CONFIG))
        self._known_hosts = _paths(env.get(ENV_KNOWN_HOSTS))
        self._keys = _paths(env.get(ENV_KEY))
        self._accept_new = self.target.accept_new or env.get(ENV_ACCEPT_NEW, "").lower() in _TRUE
        try:
            self.retry_s = float(env.get(ENV_RETRY_S) or 60.0)
        except ValueError as exc:
            raise HostError(f"bad {ENV_RETRY_S}: {exc}") from exc
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._closed = False
        self._ever_connected = False
        self.connects = 0  # connections made, the first included
        self._agents: dict[str, _Agent] = {}

    async def close(self) -> None:
        self._closed = True
        for agent in self._agents.values():
            await agent.reset()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), timeout=5)

    # -- the connection -----------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.retry_s

    async def connection(self, deadline: float | None = None) -> asyncssh.SSHClientConnection:
        """The live connection, made (or remade after a drop) if needed.

        Reconnects wait as tenacity's exponential-with-jitter computes; past ``deadline``
        (None: never) it gives up with ``ConnectionLost``.  Refusals that retrying cannot
        cure (host key, login, name resolution) raise ``HostError`` at once.
        """
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        if self._closed:
            raise HostError(f"the SSH host {self.target.display} was closed")
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            async with asyncio.timeout(remaining):
                await self._conn_lock.acquire()
        except TimeoutError:
            raise ConnectionLost(f"cannot reach {self.target.display}: another reconnect is still trying") from None
        try:
            return await self._reconnect(deadline)
        finally:
            self._conn_lock.release()

    async def _reconnect(self, deadline: float | None) -> asyncssh.SSHClientConnection:
        started = time.monotonic()
        retrying = _RECONNECT.retrying(retry_on=ConnectionLost, within_s=None if deadline is None else deadline - started,
                                       before_sleep=self._retrying_note)
        try:
            async for attempt in retrying:
                with attempt:
                    conn = self._conn
                    if conn is not None and not conn.is_closed():
                        return conn
                    self._conn = await self._open()
                    self.connects += 1
                    if self._ever_connected:
                        log.info("ssh reconnected", host=self.name, after_failures=attempt.retry_state.attempt_number - 1)
                    self._ever_connected = True
                    return self._conn
        except tenacity.RetryError as exc:
            cause = exc.last_attempt.exception()
            raise ConnectionLost(f"{cause}; retried for {time.monotonic() - started:.0f}s") from cause
        raise AssertionError("tenacity returns or raises")  # pragma: no cover

    def _retrying_note(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("ssh connection failed, retrying", host=self.name, error=str(error),
                    failures=state.attempt_number, wait_s=round(state.upcoming_sleep, 2))

    async def _open(self) -> asyncssh.SSHClientConnection:
        target = self.target
        for key in self._keys:
            if not os.path.isfile(key):
                raise HostError(f"{ENV_KEY} names {key}, which does not exist")
        record_in = Path(self._known_hosts[0] if self._known_hosts else os.path.expanduser("~/.ssh/known_hosts"))
        client = _Client(self._accept_new, self._known_hosts or [str(record_in)], record_in)
        options: dict[str, Any] = {
            "client_factory": lambda: client,
            "keepalive_interval": 10,
            "keepalive_count_max": 3,
            "connect_timeout": 20,
        }
        if target.port is not None:
            options["port"] = target.port
        if target.user is not None:
            options["username"] = target.user
        if self._config:
            options["config"] = self._config
        if self._known_hosts:
            existing = [p for p in self._known_hosts if os.path.isfile(p)]
            # An empty tuple of lists, not b'': asyncssh would read ~/.ssh/known_hosts for a falsy value.
            options["known_hosts"] = existing or ([], [], [])
        if self._keys:
            options["client_keys"] = self._keys
        with ssh_errors(target.display):
            try:
                return await asyncssh.connect(target.host, **options)
            except asyncssh.HostKeyNotVerifiable as exc:
                raise HostRefused(self._host_key_message(client, record_in)) from exc
            except asyncssh.PermissionDenied as exc:
                raise HostRefused(self._login_message()) from exc

    def _host_key_message(self, client: _Client, known_hosts: Path) -> str:
        host, port = (client.offered[0], client.offered[1]) if client.offered else (self.target.host, self.target.port or 22)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        entry = host if port == 22 else f"[{host}]:{port}"
        shown = known_hosts.as_posix()
        home = os.path.expanduser("~")
        if shown.startswith(home + "/"):
            shown = "~" + shown[len(home):]
        if client.changed:
            fingerprint = client.offered[2].get_fingerprint() if client.offered else "?"
            return (f"host key of {where} has CHANGED (now {fingerprint}): someone may be intercepting the "
                    f"connection, or the host was reinstalled; check it, then remove the old key with "
                    f"`ssh-keygen -R '{entry}' -f {shown}` and add the new one")
        return (f"host key of {where} is not in known_hosts: verify it and add it with "
                f"`ssh-keyscan -p {port} {host} >> {shown}`")

    def _login_message(self) -> str:
        target = self.target
        user = target.user or getpass.getuser()
        keys = ", ".join(self._keys) if self._keys else "your default keys and agent"
        return (f"SSH login as {user} to {target.where} was refused (wrong user or key; tried {keys}): "
                f"check the user in the host URL and that your public key is in that user's "
                f"~/.ssh/authorized_keys (`ssh-copy-id -p {target.port or 22} {user}@{target.host}`)")

    def _dropped(self, conn: asyncssh.SSHClientConnection, exc: BaseException) -> None:
        if self._conn is conn:
            self._conn = None
            log.warning("ssh connection lost", host=self.name, error=str(exc) or type(exc).__name__)
        with contextlib.suppress(Exception):
            conn.abort()

    async def _exec(self, body: str, *args: str, deadline: float | None = None, forever: bool = False,
                    timeout: float = 60.0, lane: str | None = "ops") -> tuple[int | None, bytes, bytes]:
        """Run one script; returns (exit status, stdout after the marker, stderr).

        Short scripts run in the host's resident shell for their ``lane`` (see ``_Agent``);
        ``lane=None`` gives the script a channel of its own (for slow ones such as a kill
        with a grace period).  A dropped connection is remade and the script run again:
        every script is safe to repeat (launch included, see _remote.LAUNCH).  Reconnecting
        goes on until ``deadline`` (default: now + SUPERVISE_SSH_RETRY_S), or for as long
        as it takes with ``forever``.
        """
        if forever:
            deadline = None
        elif deadline is None:
            deadline = self._deadline()
        data = _remote.script(body, *args)
        refusals = hiccups = 0
        while True:
            conn = await self.connection(deadline)
            try:
                async with asyncio.timeout(timeout):
                    if lane is not None:
                        rc, out, err = await self._agent(lane).run(conn, data)
                    else:
                        rc, out, err = await self._run_alone(conn, data)
            except TimeoutError:
                raise HostError(f"a remote command on {self.target.display} took more than {timeout:.0f}s") from None
            except _DROPS as exc:
                if _refused(conn, exc):
                    refusals += 1
                    await self._wait_for_session(exc, refusals, deadline)
                    continue
                if _gone(conn, exc):
                    self._dropped(conn, exc)
                    self._check_deadline(deadline, exc)
                    continue
                if isinstance(exc, EOFError) and hiccups < 3:
                    hiccups += 1  # the resident shell ended under us (killed?): a fresh one runs it
                    continue
                raise self._channel_error(exc) from exc
            payload = _remote.after_mark(out)
            if payload is None:
                detail = err.decode(errors="replace").strip()[-300:] or f"exit status {rc}"
                raise HostError(f"/bin/sh on {self.target.display} did not run the supervisor's script: {detail}")
            return rc, payload, err

    async def _run_alone(self, conn: asyncssh.SSHClientConnection, data: bytes) -> tuple[int | None, bytes, bytes]:
        result = await conn.run(_SHELL, input=data, encoding=None, check=False)
        if result.exit_status is None and result.exit_signal is None and conn.is_closed():
            raise asyncssh.ConnectionLost("channel closed with the connection")
        out = result.stdout if isinstance(result.stdout, bytes) else b""
        err = result.stderr if isinstance(result.stderr, bytes) else b""
        return result.exit_status, out, err

    def _agent(self, lane: str) -> _Agent:
        agent = self._agents.get(lane)
        if agent is None:
            agent = self._agents[lane] = _Agent(lane)
        return agent

    def _check_deadline(self, deadline: float | None, exc: BaseException | None) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise ConnectionLost(f"connection to {self.target.display} lost and not back within "
                                 f"{self.retry_s:.0f}s") from exc

    def _channel_error(self, exc: BaseException) -> HostError:
        if isinstance(exc, asyncssh.ChannelOpenError):
            return HostError(f"{self.target.display} refused a new SSH session ({exc.reason or exc}): its sshd "
                             "allows MaxSessions per connection, and the supervisor holds three there (plus one per "
                             "kill in progress): raise MaxSessions in the box's sshd_config")
        return HostError(f"SSH channel to {self.target.display} failed: {exc}")

    async def _wait_for_session(self, exc: BaseException, refusals: int, deadline: float | None) -> None:
        """sshd refused a session: short ones end soon and free theirs, so wait and try again."""
        wait = _SESSION.wait(refusals)
        if deadline is not None and time.monotonic() + wait > deadline:
            raise self._channel_error(exc) from exc
        if refusals == 1:
            log.warning("sshd refused a new session, waiting for one to free up", host=self.name)
        await asyncio.sleep(wait)

    async def stream(self, body: str, *args: str, reach_by: float | None = None) -> asyncssh.SSHClientProcess[bytes]:
        """Start a long-lived script; its stdin stays open (closing the channel stops it).
        ``reach_by``: a monotonic time past which a connection that cannot be made raises
        ``ConnectionLost`` (None: it is tried for as long as it takes)."""
        data = _remote.script(body, *args)
        refusals = 0
        deadline = self._deadline()
        while True:
            conn = await self.connection(reach_by)
            try:
                proc = await conn.create_process(_SHELL, encoding=None)
                proc.stdin.write(data)
                return proc
            except _DROPS as exc:
                if _refused(conn, exc):
                    refusals += 1
                    await self._wait_for_session(exc, refusals, deadline)
                    continue
                if not _gone(conn, exc):
                    raise self._channel_error(exc) from exc
                self._dropped(conn, exc)

    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    def note_drop(self, exc: BaseException) -> None:
        """A long-lived channel died: if its connection went with it, forget the connection."""
        conn = self._conn
        if conn is not None and _gone(conn, exc):
            self._dropped(conn, exc)



def _gone(conn: asyncssh.SSHClientConnection, exc: BaseException) -> bool:
    """Whether ``exc`` means the connection itself is lost (not just one channel refused)."""
    if conn.is_closed():
        return True
    if isinstance(exc, asyncssh.ChannelOpenError):
        # asyncssh's own refusal on a connection going down; sshd's refusals (MaxSessions
        # reached: "open failed") carry the same code, so the reason tells them apart.
        return exc.reason == "SSH connection closed"
    return isinstance(exc, (asyncssh.DisconnectError, ConnectionError))


def _refused(conn: asyncssh.SSHClientConnection, exc: BaseException) -> bool:
    """sshd refused one more session on a live connection (MaxSessions, default 10)."""
    return isinstance(exc, asyncssh.ChannelOpenError) and not _gone(conn, exc)

