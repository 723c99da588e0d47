"""The SSH host: attempts on a remote box, launched, watched and killed over one SSH connection.

``SshHost("ssh://[user@]host[:port][?accept_new_host_key=1&log_root=PATH]")`` implements the
``Host`` protocol (hosts/base.py) with asyncssh.  It keeps ONE connection per host, with its
channels multiplexed on it: a resident shell that runs the short operations (and one for
GPU sampling), one resident agent (python3 on the box, ``mux``) that follows every log and
watches every exit of the host's attempts, and a channel of its own for a kill (it lasts its
grace period).  A host thus carries any number of attempts on three channels plus one per
kill in progress, well within sshd's MaxSessions (default 10).  When sshd refuses one more
session, a short operation waits for one to free up, then says so.  A box where the agent
cannot start (no python3, or ``SUPERVISE_SSH_PYTHON`` not runnable or too old) runs no job:
``log_paths`` and ``launch`` refuse with a ``HostError`` whose one line says what to do.

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
    ``ConnectionLost``; following a log and waiting for an exit raise it once the connection
    cannot be remade within ``mux.REACH_S`` (5 s): the attempt is then unreachable, not
    judged, until the host answers.  Keepalives (every 10 s, 3 missed) notice a silently dead link.

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
    SUPERVISE_SSH_KERNEL_LOG     the remote command whose output holds the kernel log, read for GPU Xid
                                 lines at each GPU sample (default ``dmesg``; empty: not read)
    SUPERVISE_SSH_PYTHON         the remote Python 3 (3.8 or newer) that runs the agent (default
                                 ``python3`` on the PATH); without one the host runs no job

Remote side
    Each operation is one ``/bin/sh`` script (see _remote.py), never one round trip per
    process; short ones run in a resident shell (``_Agent``, ssh/agent.py), so the login shell and its rc
    files start once per connection, not once per operation.  Attempts are launched with the same ``WRAPPER_SH`` as locally, so they are
    detached (own session, SIGHUP ignored) and outlive the SSH connection and the daemon.
    Start times are /proc's starttime in clock ticks, compared exactly against PID reuse.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from supervisor.core.errors import HostError, LaunchError, SuperviseError
from supervisor.gpu.kernel_xids import XidCursor
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts import _remote, _remote_parse, stacks
from supervisor.hosts.base import (
    TAG_VAR,
    WRAPPER_SH,
    ExitStatus,
    KillReport,
    LaunchRequest,
    LogStat,
    ProcessHandle,
    log_paths,
)
from supervisor.hosts.ssh.connection import SshConnection
from supervisor.hosts.ssh.mux import SshMux
from supervisor.hosts.ssh.mux_follow import MuxFollower
from supervisor.hosts.ssh.target import (
    _ENV_NAME,
    DEFAULT_LOG_ROOT,
    ENV_KERNEL_LOG,
    ENV_LOG_ROOT,
    ENV_NVIDIA_SMI,
    ENV_PYSPY,
    ENV_PYTHON,
    SshTarget,
    parse_target,
)
from supervisor.hosts.stacks import StackDump

__all__ = ["MuxFollower", "SshHost", "SshTarget", "parse_target"]

log = structlog.get_logger("supervise.ssh")


class SshHost(SshConnection):
    """A remote box reached over SSH; see the module docstring."""

    def __init__(self, url: str, *, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        super().__init__(url, env=env)
        self._log_root_spec = self.target.log_root or env.get(ENV_LOG_ROOT) or DEFAULT_LOG_ROOT
        self.nvidia_smi = env.get(ENV_NVIDIA_SMI) or "nvidia-smi"
        self.pyspy = env.get(ENV_PYSPY) or "py-spy"  # on the box: its PATH, else ~/.local/bin
        self.kernel_log = env.get(ENV_KERNEL_LOG, "dmesg")
        self._xids = XidCursor()  # where the box's kernel log was read up to
        self._home: str | None = None
        self.mux = SshMux(self, env.get(ENV_PYTHON) or "python3")

    def __repr__(self) -> str:
        return f"SshHost({self.name!r})"

    # -- Host protocol ----------------------------------------------------------------------

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        # The first thing asked before an attempt: a box where the agent cannot follow the log and
        # watch the exit is refused here, in one line, before anything is stored or launched.
        await self.mux.ready()
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
        await self.mux.ready()  # nothing is launched that the agent could not watch
        env = [f"{TAG_VAR}={request.tag}"] + [f"{k}={v}" for k, v in request.env.items() if k != TAG_VAR]
        words = ["env", *env, "/bin/sh", "-c", WRAPPER_SH, "supervise-wrapper",
                 request.log_path, request.status_path, request.workdir, *request.argv]
        body = _remote.LAUNCH.replace("@LAUNCH@", " ".join(shlex.quote(w) for w in words))
        rc, out, err = await self._exec(body, request.log_path, request.status_path, request.tag)
        result = _remote_parse.parse_launch(out)
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
            await self.mux.watch(f"{handle.pid}:{_start_arg(handle)}")
        status = await self._read_status(handle, forever=True)
        return status if status is not None else ExitStatus(returncode=None, signal=None)

    async def is_alive(self, handle: ProcessHandle) -> bool:
        if handle.pid <= 0:
            return False
        _, out, _ = await self._exec(_remote.ALIVE, str(handle.pid), _start_arg(handle))
        return out.strip() == b"alive"

    async def exit_status(self, handle: ProcessHandle) -> ExitStatus | None:
        return await self._read_status(handle, forever=False)

    async def log_stat(self, path: str) -> LogStat | None:
        _, out, _ = await self._exec(_remote.LOG_STAT, path)
        return _remote_parse.parse_log_stat(out, time.time())

    async def attempt_pids(self, handle: ProcessHandle) -> set[int]:
        _, out, _ = await self._exec(_remote.ATTEMPT_PIDS, *self._attempt_args(handle))
        return _remote_parse.parse_pids(out)

    async def dump_stacks(self, handle: ProcessHandle, timeout_s: float) -> StackDump:
        pids = await self.attempt_pids(handle)
        if not pids:
            return StackDump((), "no process of the attempt is alive")
        wanted = sorted(pids)[:stacks.MAX_PROCESSES]
        _, out, _ = await self._exec(_remote.STACKS, self.pyspy, str(max(1, round(timeout_s))), *map(str, wanted),
                                     timeout=timeout_s + 30, lane=None)
        return stacks.parse_remote(out.decode(errors="replace"), self.target.display, len(pids))

    async def kill_tree(self, handle: ProcessHandle, grace_s: float) -> KillReport:
        grace_cs = str(max(0, round(grace_s * 100)))
        _, out, _ = await self._exec(_remote.KILL_TREE, *self._attempt_args(handle), grace_cs,
                                     timeout=grace_s + 60, lane=None)
        return _remote_parse.parse_kill(out)

    def follow(self, path: str, offset: int, generation: int = 0) -> MuxFollower:
        return MuxFollower(self, self.mux, path, offset, generation)

    async def close(self) -> None:
        self._closed = True
        await self.mux.close()
        await super().close()

    # -- GPUs ---------------------------------------------------------------------------------

    async def sample_gpus(self) -> GpuSample:
        """nvidia-smi on the remote box, one call per sample; never raises."""
        ts = time.time()
        try:
            rc, out, err = await self._exec(_remote.GPUS, self.nvidia_smi, self.kernel_log, lane="gpu",
                                            deadline=time.monotonic() + min(self.retry_s, 15.0), timeout=60)
        except SuperviseError as exc:
            return GpuSample(ts, False, f"cannot sample GPUs on {self.target.display}: {exc}", (), ())
        except Exception as exc:  # noqa: BLE001 - a sampler that raises would stop the daemon's GPU view
            return GpuSample(ts, False, f"cannot sample GPUs on {self.target.display}: {exc!r}", (), ())
        text = out.decode(errors="replace")
        lines = text.splitlines()
        if lines[:1] == ["missing"]:
            return GpuSample(ts, False, f"nvidia-smi not found on {self.target.display}", (), ())
        return _remote_parse.gpu_sample(ts, rc, lines, err.decode(errors="replace"), self.target.display, self._xids)

    async def program_pid(self, handle: ProcessHandle) -> int | None:
        """The wrapper's child on the box (its program); None while it has none."""
        if handle.pid <= 1:
            return None
        _, out, _ = await self._exec(_remote.PROGRAM_PID, str(handle.pid))
        found = _remote_parse.parse_pids(out)
        return min(found) if found else None

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

    async def run_op(self, body: str, *args: str) -> tuple[int | None, bytes, bytes]:
        """Run a short script in the resident shell; (exit status, what it printed after its marker, stderr)."""
        return await self._exec(body, *args)

    async def run_script(self, body: str, *args: str, timeout: float = 60.0) -> tuple[int | None, bytes, bytes]:
        """Run one of _remote's scripts; what it printed after its marker (used by doctor)."""
        return await self._exec(body, *args, timeout=timeout, lane=None)

    def _attempt_args(self, handle: ProcessHandle) -> tuple[str, str, str, str]:
        return str(max(0, handle.pid)), _start_arg(handle), str(max(0, handle.pgid)), handle.tag

    async def _read_status(self, handle: ProcessHandle, *, forever: bool) -> ExitStatus | None:
        _, out, _ = await self._exec(_remote.EXIT_STATUS_AGED, handle.status_path, forever=forever)
        return _remote_parse.parse_exit_status(out, time.time())


def _start_arg(handle: ProcessHandle) -> str:
    return "-" if handle.start_time is None else str(int(handle.start_time))
