"""The SSH host: attempts on a remote box, launched, watched and killed over one SSH connection.

``SshHost("ssh://[user@]host[:port][?accept_new_host_key=1&log_root=PATH]")`` implements the
``Host`` protocol (host.py) with asyncssh.  It keeps ONE connection per host, with its
channels multiplexed on it: a resident shell that runs the short operations (and one for
GPU sampling), one channel per followed log, one for all of the host's exit waits, and a
channel of its own for a kill (it lasts its grace period).  sshd allows MaxSessions
(default 10) channels per connection: about eight jobs followed at once per host.  When
sshd refuses one more, a short operation waits for a session to free up, then says so.

Connection
    ``~/.ssh/config`` and the user's keys and agent are used as OpenSSH would (asyncssh reads
    them).  Host keys are checked against known_hosts; an unknown key is refused with a
    one-line ``HostError`` that says how to add it (nothing is run on that box).  Trust on
    first use only when asked for: ``SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS=1`` or
    ``?accept_new_host_key=1`` in the host URL accept a host that has no known_hosts entry
    yet and record its key (OpenSSH's ``accept-new``); a *changed* key is always refused.
    A wrong user or key is a clear ``HostError``.  When the connection drops, the next use
    reconnects, with waits from tenacity (exponential, capped at 10 s, jittered): one-shot
    operations keep trying for ``SUPERVISE_SSH_RETRY_S`` (default 60 s) and then raise
    ``ConnectionLost``; following a log and waiting for an exit keep trying for as long as
    they are wanted.  Keepalives (every 10 s, 3 missed) notice a silently dead link.

Environment (read when the SshHost is made; the daemon's environment):
    SUPERVISE_SSH_CONFIG         ssh client config file(s), ``:``-separated, instead of ~/.ssh/config
    SUPERVISE_SSH_KNOWN_HOSTS    known_hosts file(s) instead of ~/.ssh/known_hosts (or the config's
                                 UserKnownHostsFile); the first is where accepted keys are added
    SUPERVISE_SSH_KEY            private key file(s) to offer instead of the default ones (the agent
                                 is still asked)
    SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS=1   accept and record keys of hosts not yet in known_hosts
    SUPERVISE_SSH_LOG_ROOT       the attempts' log root on the remote box (default
                                 ``~/.local/state/supervise/logs``, ``~`` expanded there)
    SUPERVISE_SSH_RETRY_S        how long one-shot operations retry a lost connection (default 60)
    SUPERVISE_SSH_NVIDIA_SMI     the remote nvidia-smi command (default ``nvidia-smi`` on the PATH)

Remote side
    Each operation is one ``/bin/sh`` script (see _remote.py), never one round trip per
    process; short ones run in a resident shell (``_Agent``), so the login shell and its rc
    files start once per connection, not once per operation.  Attempts are launched with the same ``WRAPPER_SH`` as locally, so they are
    detached (own session, SIGHUP ignored) and outlive the SSH connection and the daemon.
    Start times are /proc's starttime in clock ticks, compared exactly against PID reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import re
import secrets
import shlex
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncssh
import structlog
import tenacity

from . import _remote
from ..backoff import Backoff
from ..errors import ConnectionLost, HostError, LaunchError, SuperviseError
from ._errors import ssh_errors
from ..events import Record
from ..gpu import GpuSample
from .base import (
    TAG_VAR,
    WRAPPER_SH,
    ExitStatus,
    KillReport,
    LaunchRequest,
    ProcessHandle,
    log_paths,
)
from ..records import MAX_RECORD_BYTES, split_records, unterminated_text

log = structlog.get_logger("supervise.ssh")
T = TypeVar("T")

ENV_CONFIG = "SUPERVISE_SSH_CONFIG"
ENV_KNOWN_HOSTS = "SUPERVISE_SSH_KNOWN_HOSTS"
ENV_KEY = "SUPERVISE_SSH_KEY"
ENV_ACCEPT_NEW = "SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS"
ENV_LOG_ROOT = "SUPERVISE_SSH_LOG_ROOT"
ENV_RETRY_S = "SUPERVISE_SSH_RETRY_S"
ENV_NVIDIA_SMI = "SUPERVISE_SSH_NVIDIA_SMI"

DEFAULT_LOG_ROOT = "~/.local/state/supervise/logs"
_SHELL = "/bin/sh -s"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TRUE = {"1", "yes", "true", "on"}
_QUERY_KEYS = {"accept_new_host_key", "log_root"}
# How a channel fails: a dropped connection, a refused session, a remote script that ended.
_DROPS: tuple[type[BaseException], ...] = (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError,
                                           asyncio.IncompleteReadError, EOFError)
# Waits between tries: reconnecting (0.25 s doubling to 10 s, jittered), a refused session
# (0.1 s doubling to 1 s: short ones end soon), a channel that dropped (0.1 s doubling to 2 s).
_RECONNECT = Backoff(initial_s=0.25, max_s=10.0, jitter_s=0.25)
_SESSION = Backoff(initial_s=0.1, max_s=1.0)
_CHANNEL = Backoff(initial_s=0.1, max_s=2.0)


# -- the host's address --------------------------------------------------------------------

@dataclass(frozen=True)
class SshTarget:
    url: str
    host: str
    port: int | None
    user: str | None
    accept_new: bool
    log_root: str | None

    @property
    def where(self) -> str:
        """host:port as ssh-keyscan and people write it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port or 22}"

    @property
    def display(self) -> str:
        return f"{self.user}@{self.where}" if self.user else self.where


def parse_target(url: str) -> SshTarget:
    """``ssh://[user@]host[:port][?accept_new_host_key=1&log_root=PATH]``."""
    parts = urlsplit(url)
    usage = "use ssh://[user@]host[:port]"
    if parts.scheme != "ssh" or not parts.hostname:
        raise HostError(f"bad SSH host '{url}': {usage}")
    try:
        port = parts.port
    except ValueError as exc:
        raise HostError(f"bad SSH host '{url}': {exc}; {usage}") from exc
    if parts.path not in ("", "/") or parts.password is not None:
        raise HostError(f"bad SSH host '{url}': no path or password allowed; {usage}")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - _QUERY_KEYS)
    if unknown:
        raise HostError(f"bad SSH host '{url}': unknown option {', '.join(unknown)} "
                        f"(known: {', '.join(sorted(_QUERY_KEYS))})")
    accept = query.get("accept_new_host_key", ["0"])[-1].lower() in _TRUE
    root = query.get("log_root", [""])[-1] or None
    return SshTarget(url=url, host=parts.hostname, port=port, user=parts.username or None,
                     accept_new=accept, log_root=root)


def _paths(value: str | None) -> list[str]:
    return [os.path.expanduser(p) for p in (value or "").split(os.pathsep) if p]


# -- host keys -------------------------------------------------------------------------------

class _Client(asyncssh.SSHClient):
    """Called by asyncssh for a host key that known_hosts does not vouch for: note it, and
    accept it only for a host with no entry at all when accept-new was asked for."""

    def __init__(self, accept_new: bool, known_hosts: list[str], record_in: Path) -> None:
        self.accept_new = accept_new
        self.known_hosts = known_hosts
        self.record_in = record_in
        self.offered: tuple[str, int, asyncssh.SSHKey] | None = None
        self.changed = False
        self.accepted = False

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = (host, port, key)
        if self._has_entry(host, addr, port):
            self.changed = True
            return False
        if not self.accept_new:
            return False
        name = host if port == 22 else f"[{host}]:{port}"
        line = f"{name} {key.export_public_key('openssh').decode().strip()}\n"
        try:
            self.record_in.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.record_in, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError as exc:
            log.warning("could not record the new host key", file=str(self.record_in), error=str(exc))
        log.warning("accepted a new host key", host=name, fingerprint=key.get_fingerprint(),
                    recorded_in=str(self.record_in))
        self.accepted = True
        return True

    def _has_entry(self, host: str, addr: str, port: int) -> bool:
        for path in self.known_hosts:
            if not os.path.isfile(path):
                continue
            try:
                trusted = asyncssh.match_known_hosts(path, host, addr, None if port == 22 else port)
            except (OSError, ValueError, asyncssh.Error):
                continue
            if trusted[0] or trusted[1]:
                return True
        return False


# -- the host --------------------------------------------------------------------------------

class SshHost:
    """A remote box reached over SSH; see the module docstring."""

    def __init__(self, url: str, *, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.name = url
        self.target = parse_target(url)
        self._config = _paths(env.get(ENV_CONFIG))
        self._known_hosts = _paths(env.get(ENV_KNOWN_HOSTS))
        self._keys = _paths(env.get(ENV_KEY))
        self._accept_new = self.target.accept_new or env.get(ENV_ACCEPT_NEW, "").lower() in _TRUE
        self._log_root_spec = self.target.log_root or env.get(ENV_LOG_ROOT) or DEFAULT_LOG_ROOT
        self.nvidia_smi = env.get(ENV_NVIDIA_SMI) or "nvidia-smi"
        try:
            self.retry_s = float(env.get(ENV_RETRY_S) or 60.0)
        except ValueError as exc:
            raise HostError(f"bad {ENV_RETRY_S}: {exc}") from exc
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._home: str | None = None
        self._closed = False
        self._ever_connected = False
        self.connects = 0  # connections made, the first included
        self._watcher = _ExitWatcher(self)
        self._agents: dict[str, _Agent] = {}

    def __repr__(self) -> str:
        return f"SshHost({self.name!r})"

    # -- Host protocol ----------------------------------------------------------------------

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        root = await self.log_root()
        base = log_paths(Path(root), job, attempt)[0][: -len(".log")]
        _, out, _ = await self._exec(_remote.LOG_SUFFIX, base)
        words = out.split()
        suffix = int(words[0]) if words and words[0].isdigit() else 0
        return log_paths(Path(root), job, attempt, suffix)

    async def launch(self, request: LaunchRequest) -> ProcessHandle:
        bad = [k for k in request.env if not _ENV_NAME.match(k)]
        if bad:
            raise LaunchError(f"cannot launch {request.argv[0]}: invalid environment variable name {bad[0]!r}")
        env = [f"{TAG_VAR}={request.tag}"] + [f"{k}={v}" for k, v in request.env.items() if k != TAG_VAR]
        words = ["env", *env, "/bin/sh", "-c", WRAPPER_SH, "supervise-wrapper",
                 request.log_path, request.status_path, request.workdir, *request.argv]
        body = _remote.LAUNCH.replace("@LAUNCH@", " ".join(shlex.quote(w) for w in words))
        rc, out, err = await self._exec(body, request.log_path, request.status_path, request.tag)
        result = _remote.parse_launch(out)
        if isinstance(result, int):
            raise LaunchError(f"the connection to {self.target.display} dropped while launching {request.argv[0]}; "
                              f"it has already ended (exit status {result}): see {request.log_path} there")
        if rc != 0 or result is None:
            detail = err.decode(errors="replace").strip() or out.decode(errors="replace").strip() or f"exit {rc}"
            raise LaunchError(f"launch of {request.argv[0]} on {self.target.display} failed: {detail}")
        if result.pgid != result.pid:
            log.warning("wrapper did not start its own session in time", host=self.name, pid=result.pid)
        return ProcessHandle(pid=result.pid, start_time=None if result.start == "-" else float(int(result.start)),
                             pgid=result.pid, tag=request.tag, log_path=request.log_path,
                             status_path=request.status_path)

    async def wait_exit(self, handle: ProcessHandle) -> ExitStatus:
        if handle.pid > 0:
            await self._watcher.wait(f"{handle.pid}:{_start_arg(handle)}")
        status = await self._read_status(handle, forever=True)
        return status if status is not None else ExitStatus(returncode=None, signal=None)

    async def is_alive(self, handle: ProcessHandle) -> bool:
        if handle.pid <= 0:
            return False
        _, out, _ = await self._exec(_remote.ALIVE, str(handle.pid), _start_arg(handle))
        return out.strip() == b"alive"

    async def exit_status(self, handle: ProcessHandle) -> ExitStatus | None:
        return await self._read_status(handle, forever=False)

    async def attempt_pids(self, handle: ProcessHandle) -> set[int]:
        _, out, _ = await self._exec(_remote.ATTEMPT_PIDS, *self._attempt_args(handle))
        return _remote.parse_pids(out)

    async def kill_tree(self, handle: ProcessHandle, grace_s: float) -> KillReport:
        grace_cs = str(max(0, round(grace_s * 100)))
        _, out, _ = await self._exec(_remote.KILL_TREE, *self._attempt_args(handle), grace_cs,
                                     timeout=grace_s + 60, lane=None)
        return _remote.parse_kill(out)

    def follow(self, path: str, offset: int) -> SshFollower:
        return SshFollower(self, path, offset)

    async def close(self) -> None:
        self._closed = True
        await self._watcher.close()
        for agent in self._agents.values():
            await agent.reset()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), timeout=5)

    # -- GPUs ---------------------------------------------------------------------------------

    async def sample_gpus(self) -> GpuSample:
        """nvidia-smi on the remote box, one call per sample; never raises."""
        ts = time.time()
        try:
            rc, out, err = await self._exec(_remote.GPUS, self.nvidia_smi, lane="gpu",
                                            deadline=time.monotonic() + min(self.retry_s, 15.0), timeout=60)
        except SuperviseError as exc:
            return GpuSample(ts, False, f"cannot sample GPUs on {self.target.display}: {exc}", (), ())
        except Exception as exc:  # noqa: BLE001 - a sampler that raises would stop the daemon's GPU view
            return GpuSample(ts, False, f"cannot sample GPUs on {self.target.display}: {exc!r}", (), ())
        text = out.decode(errors="replace")
        lines = text.splitlines()
        if lines[:1] == ["missing"]:
            return GpuSample(ts, False, f"nvidia-smi not found on {self.target.display}", (), ())
        if rc != 0 or "gpus" not in lines or "apps" not in lines:
            detail = " ".join(ln for ln in lines if ln not in ("gpus", "apps"))[:300] or err.decode(errors="replace")
            return GpuSample(ts, False, f"nvidia-smi failed on {self.target.display}: {detail.strip()}", (), ())
        at_gpus, at_apps = lines.index("gpus"), lines.index("apps")
        devices = _remote.parse_gpus(lines[at_gpus + 1 : at_apps])
        processes = _remote.parse_apps(lines[at_apps + 1 :], devices)
        return GpuSample(ts, True, "", tuple(devices), tuple(processes))

    # -- remote facts -------------------------------------------------------------------------

    async def log_root(self) -> str:
        """The remote log root with ``~`` expanded on the remote box."""
        spec = self._log_root_spec
        if spec.startswith("/"):
            return spec.rstrip("/") or "/"
        home = await self.remote_home()
        rest = spec[1:].lstrip("/") if spec.startswith("~") else spec
        return f"{home.rstrip('/')}/{rest}".rstrip("/")

    async def remote_home(self) -> str:
        if self._home is None:
            _, out, _ = await self._exec(_remote.INFO)
            for line in out.decode(errors="replace").splitlines():
                if line.startswith("home "):
                    self._home = line[5:].strip()
            if not self._home:
                raise HostError(f"cannot tell the home directory on {self.target.display}: $HOME is empty")
        return self._home

    async def run_script(self, body: str, *args: str, timeout: float = 60.0) -> tuple[int | None, bytes, bytes]:
        """Run one of _remote's scripts; what it printed after its marker (used by doctor)."""
        return await self._exec(body, *args, timeout=timeout, lane=None)

    def _attempt_args(self, handle: ProcessHandle) -> tuple[str, str, str, str]:
        return str(max(0, handle.pid)), _start_arg(handle), str(max(0, handle.pgid)), handle.tag

    async def _read_status(self, handle: ProcessHandle, *, forever: bool) -> ExitStatus | None:
        _, out, _ = await self._exec(_remote.EXIT_STATUS, handle.status_path, forever=forever)
        first, _, text = out.partition(b"\n")
        if first.strip() != b"present":
            return None
        value = text.decode(errors="replace").strip()
        return ExitStatus.from_wrapper_code(int(value)) if value.lstrip("-").isdigit() else None

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
                raise HostError(self._host_key_message(client, record_in)) from exc
            except asyncssh.PermissionDenied as exc:
                raise HostError(self._login_message()) from exc

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
            agent = self._agents[lane] = _Agent(self, lane)
        return agent

    def _check_deadline(self, deadline: float | None, exc: BaseException | None) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise ConnectionLost(f"connection to {self.target.display} lost and not back within "
                                 f"{self.retry_s:.0f}s") from exc

    def _channel_error(self, exc: BaseException) -> HostError:
        if isinstance(exc, asyncssh.ChannelOpenError):
            return HostError(f"{self.target.display} refused a new SSH session ({exc.reason or exc}): its sshd "
                             "allows MaxSessions (default 10) per connection and each running job holds one for "
                             "its log: raise MaxSessions in the box's sshd_config")
        return HostError(f"SSH channel to {self.target.display} failed: {exc}")

    async def _wait_for_session(self, exc: BaseException, refusals: int, deadline: float | None) -> None:
        """sshd refused a session: short ones end soon and free theirs, so wait and try again."""
        wait = _SESSION.wait(refusals)
        if deadline is not None and time.monotonic() + wait > deadline:
            raise self._channel_error(exc) from exc
        if refusals == 1:
            log.warning("sshd refused a new session, waiting for one to free up", host=self.name)
        await asyncio.sleep(wait)

    async def stream(self, body: str, *args: str) -> asyncssh.SSHClientProcess[bytes]:
        """Start a long-lived script; its stdin stays open (closing the channel stops it)."""
        data = _remote.script(body, *args)
        refusals = 0
        deadline = self._deadline()
        while True:
            conn = await self.connection(None)
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


class _Closed(Exception):
    """The follower was closed while it waited."""


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


def _start_arg(handle: ProcessHandle) -> str:
    return "-" if handle.start_time is None else str(int(handle.start_time))


async def _close_process(proc: asyncssh.SSHClientProcess[bytes] | None) -> None:
    """End a long-lived remote script: closing its stdin ends the `cat` it blocks in."""
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.stdin.write_eof()
    with contextlib.suppress(Exception):
        proc.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait_closed(), timeout=2)


async def _header(proc: asyncssh.SSHClientProcess[bytes]) -> int:
    """Skip to the script's header line '@@supervise@@ N' and return N."""
    prefix = _remote.MARK + b" "
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise EOFError("the remote script ended before its header")
        if line.startswith(prefix):
            return int(line[len(prefix):].strip() or 0)


# -- the resident shells ------------------------------------------------------------------------

class _Agent:
    """A long-lived ``/bin/sh`` on the remote box that runs short scripts one after another.

    Every SSH exec starts the user's login shell, and with it their rc files (``conda
    init`` or ``pyenv init`` in a ``.bashrc`` cost 0.1-0.5 s of CPU a time): a resident
    shell pays that once per connection, and each script then costs one ``fork`` of it.
    Each script runs in a subshell with stdin from /dev/null (it can never read the
    command stream) and its stderr in a scratch file; a random end marker frames the
    answer.  Scripts in one lane run one at a time; slow ones get their own channel.
    The shell exits when its channel closes (EOF on stdin), removing its scratch file.
    """

    def __init__(self, host: SshHost, lane: str) -> None:
        self._host = host
        self.lane = lane
        self._lock = asyncio.Lock()
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        token = secrets.token_hex(8)
        self._end = f"@@supervise-end-{token}@@".encode()
        self._err_end = f"@@supervise-err-{token}@@".encode()

    async def run(self, conn: asyncssh.SSHClientConnection, script: bytes) -> tuple[int | None, bytes, bytes]:
        async with self._lock:
            if self._proc is None or self._conn is not conn:
                await self._start(conn)
            proc = self._proc
            assert proc is not None
            try:
                proc.stdin.write(b"(\n" + script + b") </dev/null 2>\"$_e\"\n_r=$?\n"
                                 b"printf '\\n%s %s\\n' '" + self._end + b"' \"$_r\"\n"
                                 b"cat \"$_e\"\nprintf '%s\\n' '" + self._err_end + b"'\n")
                out = await proc.stdout.readuntil(b"\n" + self._end + b" ")
                rc = (await proc.stdout.readline()).strip()
                err = await proc.stdout.readuntil(self._err_end + b"\n")
            except asyncio.IncompleteReadError as exc:
                await self._reset_locked()
                raise EOFError(f"the resident shell ({self.lane}) ended") from exc
            except BaseException:
                await self._reset_locked()  # cancelled or failed half-way: its state is unknown
                raise
        status = int(rc) if rc.lstrip(b"-").isdigit() else None
        return status, out[: -len(self._end) - 2], err[: -len(self._err_end) - 1]

    async def reset(self) -> None:
        async with self._lock:
            await self._reset_locked()

    async def _reset_locked(self) -> None:
        proc, self._proc, self._conn = self._proc, None, None
        await _close_process(proc)

    async def _start(self, conn: asyncssh.SSHClientConnection) -> None:
        await self._reset_locked()
        proc = await conn.create_process(_SHELL, encoding=None)
        proc.stdin.write(b"exec 2>/dev/null\n"
                         b"_e=$(mktemp 2>/dev/null) || _e=/tmp/supervise-agent.$$\n"
                         b"trap 'rm -f \"$_e\"' EXIT\n"
                         b"trap 'exit 1' HUP PIPE TERM\n")
        self._proc, self._conn = proc, conn


# -- waiting for exits ------------------------------------------------------------------------

class _ExitWatcher:
    """All of a host's exit waits on one channel (see _remote.WATCH_EXITS for why it polls
    remotely).  The remote script is restarted with the new set when a wait is added; it
    reports each pid as it ends, and the waiters for it wake at once."""

    def __init__(self, host: SshHost) -> None:
        self._host = host
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, key: str) -> None:
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
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

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


# -- following a remote log -------------------------------------------------------------------

_NOTICES = (b"file truncated", b"has been replaced", b"has appeared")
_DRAIN_ERRORS: tuple[type[BaseException], ...] = (*_DROPS, TimeoutError)


class SshFollower:
    """Follow a remote log from a byte offset: the same interface and the same records as
    ``LogFollower`` (records are cut by ``split_records`` from the same bytes).

    One channel runs ``tail -c +OFFSET+1 -F`` on the remote box (inotify there).  The byte
    offset is counted here; after a dropped connection the follower starts again exactly at
    the end of the last complete record it yielded (the partial line it held is read
    again), so nothing is lost or doubled.  ``finish()`` switches to one plain read from
    that offset to the end, then emits the trailing partial line.

    Truncation and replacement of the file are seen through tail's notices ("file
    truncated", "has been replaced"): what was held is emitted and following restarts at
    0.  Those notices travel on stderr, beside the data, so output written in the very same
    instant may be attributed to the old file; the supervisor's own logs are append-only.
    """

    def __init__(self, host: SshHost, path: str, offset: int = 0, *, chunk_size: int = 1 << 20) -> None:
        if offset < 0 or chunk_size <= 0:
            raise ValueError("offset must be >= 0 and chunk_size > 0")
        self._host = host
        self.path = path
        self.chunk_size = chunk_size
        self.truncations = 0
        self.restarts = 0  # channels started again after a drop
        self._offset = offset
        self._pending = bytearray()
        self._finishing = False
        self._closed = False
        self._waiting = False
        self._reset = False  # tail reported truncation or replacement
        self._wakeup = asyncio.Event()
        self._closed_event = asyncio.Event()
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._notices: asyncio.Task[None] | None = None
        self._last_error = ""
        self._iterator: AsyncGenerator[list[Record], None] | None = None

    @property
    def offset(self) -> int:
        """Byte offset just past the last record yielded: where a restarted follower resumes."""
        return self._offset

    @property
    def buffered(self) -> int:
        return len(self._pending)

    def partial_text(self, limit: int = 4096) -> str:
        """The unterminated tail received after the last record (see ``LogFollower.partial_text``)."""
        return unterminated_text(self._pending, limit)

    def records(self) -> AsyncIterator[list[Record]]:
        if self._iterator is not None:
            raise RuntimeError("SshFollower.records() can be iterated only once")
        self._iterator = self._iterate()
        return self._iterator

    def finish(self) -> None:
        """The writer has exited: read to EOF, emit the trailing partial line, then end."""
        self._finishing = True
        self._wakeup.set()

    async def aclose(self) -> None:
        """Stop following and close the channel; the iterator ends."""
        self._closed = True
        self._closed_event.set()
        self._wakeup.set()
        proc, self._proc = self._proc, None
        await _close_process(proc)
        iterator = self._iterator
        if iterator is not None and not self._waiting:
            try:
                await iterator.aclose()
            except RuntimeError:
                pass  # running in another task right now; it will see _closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- the loop -------------------------------------------------------------------------

    async def _iterate(self) -> AsyncGenerator[list[Record], None]:
        drops = 0
        dead_ends = 0  # the remote tail ended although the connection is fine
        while not self._closed:
            if self._finishing:
                async for batch in self._drain():
                    yield batch
                return
            proc = None
            try:
                proc = await self._guard(self._start(_remote.FOLLOW))
                while not self._closed and not self._finishing:
                    chunk = await self._read(proc)
                    if self._reset:
                        tail = self._restart_at_zero()
                        if tail:
                            yield tail
                        break
                    if chunk is None:
                        continue  # woken by finish() or aclose()
                    if not chunk:
                        raise EOFError("the remote tail ended")
                    drops = dead_ends = 0
                    batch = self._feed(chunk)
                    if batch:
                        yield batch
            except _Closed:
                return
            except _DROPS as exc:
                if self._closed:
                    return
                if isinstance(exc, EOFError) and self._host.connected():
                    dead_ends += 1
                    if dead_ends >= 5:
                        raise HostError(f"cannot follow {self.path} on {self._host.target.display}: the remote "
                                        f"`tail -F` keeps ending ({self._last_error or 'no message'})") from exc
                self._host.note_drop(exc)
                drops += 1
                self.restarts += 1
                log.info("following again after a dropped channel", host=self._host.name, path=self.path,
                         offset=self._offset, error=str(exc) or type(exc).__name__)
                if drops > 1 or dead_ends:
                    try:
                        await self._guard(asyncio.sleep(_CHANNEL.wait(drops + dead_ends)))
                    except _Closed:
                        return
            finally:
                await self._stop(proc)

    async def _drain(self) -> AsyncGenerator[list[Record], None]:
        failures = 0
        while not self._closed:
            proc = None
            try:
                proc = await self._guard(self._start(_remote.DRAIN))
                while True:
                    chunk = await self._guard(proc.stdout.read(self.chunk_size))
                    if not chunk:
                        break
                    batch = self._feed(chunk)
                    if batch:
                        yield batch
                await self._guard(asyncio.wait_for(proc.wait_closed(), timeout=10))
                if proc.exit_status is None and proc.exit_signal is None:
                    raise EOFError("the channel closed before the log's end")
                tail = self._flush()
                if tail:
                    yield tail
                return
            except _Closed:
                return
            except _DRAIN_ERRORS as exc:
                if self._closed:
                    return
                self._host.note_drop(exc)
                failures += 1
                self.restarts += 1
                try:
                    await self._guard(asyncio.sleep(_CHANNEL.wait(failures)))
                except _Closed:
                    return
            finally:
                await self._stop(proc)

    async def _guard(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless the follower is closed first (then ``_Closed``)."""
        task = asyncio.ensure_future(awaitable)
        closed = asyncio.ensure_future(self._closed_event.wait())
        try:
            await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task.cancelled():
            raise _Closed
        return task.result()

    async def _start(self, body: str) -> asyncssh.SSHClientProcess[bytes]:
        self._pending = bytearray()  # re-read from the end of the last yielded record
        self._reset = False
        proc = await self._host.stream(body, self.path, str(self._offset))
        self._proc = proc
        try:
            start = await _header(proc)
        except BaseException:
            await _close_process(proc)
            raise
        if start != self._offset:
            self.truncations += 1
            log.warning("stored offset past the end of the remote log: following from the start",
                        host=self._host.name, path=self.path, offset=self._offset)
            self._offset = start
        self._notices = asyncio.create_task(self._watch_notices(proc))
        return proc

    async def _stop(self, proc: asyncssh.SSHClientProcess[bytes] | None) -> None:
        notices, self._notices = self._notices, None
        if notices is not None:
            notices.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await notices
        if proc is not None and self._proc is proc:
            self._proc = None
        await _close_process(proc)

    async def _read(self, proc: asyncssh.SSHClientProcess[bytes]) -> bytes | None:
        """The next chunk; None when woken instead (finish, close, or a reset notice)."""
        self._wakeup.clear()
        if self._finishing or self._closed or self._reset:
            return None
        reader = asyncio.ensure_future(proc.stdout.read(self.chunk_size))
        woken = asyncio.ensure_future(self._wakeup.wait())
        self._waiting = True
        try:
            await asyncio.wait({reader, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting = False
            woken.cancel()
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        if reader.cancelled():
            return None
        return reader.result()

    async def _watch_notices(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        with contextlib.suppress(Exception):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    return
                self._last_error = line.decode(errors="replace").strip()[:300]
                if any(n in line for n in _NOTICES):
                    if b"has appeared" in line and self._offset == 0 and not self._pending:
                        continue  # the file we waited for: tail reads it from its start already
                    self._reset = True
                    self._wakeup.set()

    def _restart_at_zero(self) -> list[Record]:
        self.truncations += 1
        log.warning("remote log truncated or replaced: following from the start", host=self._host.name,
                    path=self.path, offset=self._offset + len(self._pending))
        tail = self._flush()
        self._offset = 0
        return tail

    # -- splitting, as LogFollower does -----------------------------------------------------

    def _feed(self, chunk: bytes) -> list[Record]:
        if self._pending:
            self._pending += chunk
            if not self._may_complete(chunk):
                return []
            data = bytes(self._pending)
        else:
            data = chunk
        batch, used = split_records(data, self._offset, final=False)
        self._pending = bytearray(data[used:])
        self._offset += used
        return batch

    def _may_complete(self, chunk: bytes) -> bool:
        held_cr = len(self._pending) > len(chunk) and self._pending[-len(chunk) - 1] == 0x0D
        return len(self._pending) > MAX_RECORD_BYTES or b"\n" in chunk or b"\r" in chunk or held_cr

    def _flush(self) -> list[Record]:
        batch, used = split_records(bytes(self._pending), self._offset, final=True)
        self._pending = bytearray()
        self._offset += used
        return batch
