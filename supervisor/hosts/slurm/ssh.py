"""The Slurm host on a login node: ``slurm+ssh://[user@]login-node[:port][?log_root=PATH&accept_new_host_key=1]``.

A ``SlurmHost`` (slurm.py) whose Slurm commands (`sbatch`, `squeue`, `scontrol`, `sacct`,
`scancel`, `srun`) run on the login node over an ``SshHost`` (its resident shell, one SSH
connection), with the same ``[slurm]`` spec fields.  The attempts' log root is ``?log_root=``,
else SUPERVISE_SLURM_LOG_ROOT, else the SSH host's (``~/.local/state/supervise/logs`` on the
login node); the nodes must see it at the same path, as for ``slurm:``.

Where the daemon sees that log root too (one shared file system: checked once, by a file
written there over SSH and read here), logs and exit files are read here, as ``slurm:`` does;
else over the SSH host (its agent follows the logs).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import structlog

from supervisor.core.errors import HostError, SpecError
from supervisor.hosts import _remote
from supervisor.hosts.base import Follower, ListenAddress
from supervisor.hosts.slurm.files import LocalFiles, SlurmFiles
from supervisor.hosts.slurm.host import ENV_LOG_ROOT, SlurmHost
from supervisor.hosts.slurm.jobs import SlurmCommands
from supervisor.hosts.ssh.host import SshHost
from supervisor.hosts.ssh.target import _ENV_NAME, listen_address, parse_target

log = structlog.get_logger("supervise.slurm")
_USAGE = "use slurm+ssh://[user@]login-node[:port]"

# $1 'with' or 'none', $2 what the command reads on stdin, then the command.
_RUN = r"""
with=$1 input=$2
shift 2
if [ "$with" = with ]; then printf '%s' "$input" | "$@"; else "$@" </dev/null; fi
"""

_PREPARE = r"""
( umask 077 && mkdir -p -- "${1%/*}" ) && chmod 700 -- "${1%/*}" && rm -f -- "$2" "$2.tmp"
"""

# $1 the log root, $2 a token: writes the token to a new file there and prints its path.
_PROBE = r"""
( umask 077 && mkdir -p -- "$1" ) && f=$(mktemp "$1/.supervise-visible.XXXXXX") && printf '%s' "$2" >"$f" && echo "$f"
"""


def login_node_address(name: str) -> ListenAddress | None:
    """The slurm+ssh:// kind's reach hook (`hosts/registry.py`): the login node's address, as for ssh://."""
    return listen_address("ssh" + name[len("slurm+ssh") :])


def ssh_url(name: str) -> str:
    """The SSH host URL of a ``slurm+ssh://`` host; SpecError, in one line, for a bad one."""
    parts = urlsplit(name)
    if parts.scheme != "slurm+ssh" or not parts.hostname:
        raise SpecError(f"host '{name}': no login node named; {_USAGE}")
    try:
        port = parts.port
    except ValueError as exc:
        raise SpecError(f"host '{name}': bad port ({exc}); {_USAGE}") from None
    query = parse_qs(parts.query, keep_blank_values=True)
    root = (query.pop("log_root", None) or [os.environ.get(ENV_LOG_ROOT, "")])[-1]
    if root:
        query["log_root"] = [root]
    if port == 0:
        raise SpecError(f"host '{name}': bad port 0; {_USAGE}")
    url = f"ssh://{parts.netloc}{parts.path}" + (f"?{urlencode(query, doseq=True)}" if query else "")
    try:
        parse_target(url)
    except HostError as exc:
        raise SpecError(f"host '{name}': {str(exc).partition(': ')[2] or exc}") from None
    return url


class SshSlurmCommands(SlurmCommands):
    """Slurm's commands run on the login node, in the SSH host's resident shell."""

    def __init__(self, ssh: SshHost) -> None:
        super().__init__()
        self._ssh = ssh

    async def run(self, argv: list[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        bad = [k for k in (env or {}) if not _ENV_NAME.match(k)]
        if bad:
            raise HostError(f"cannot run {argv[0]}: invalid environment variable name {bad[0]!r}")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv
        mode = "with" if stdin is not None else "none"
        text = (stdin or b"").decode(errors="replace")
        rc, out, err = await self._ssh.run_op(_RUN, mode, text, *words)
        status = -1 if rc is None else rc
        if status == 127:
            raise HostError(f"cannot run {argv[0]} on {self._ssh.target.display}: not on the login node's PATH "
                            f"({err.decode(errors='replace').strip()[:200]})")
        return status, out.decode(errors="replace"), err.decode(errors="replace")


class RemoteFiles:
    """The attempts' files on the login node, read over the SSH host."""

    def __init__(self, ssh: SshHost) -> None:
        self._ssh = ssh

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        return await self._ssh.log_paths(job, attempt)

    async def prepare(self, log_path: str, status_path: str) -> None:
        rc, _, err = await self._ssh.run_op(_PREPARE, log_path, status_path)
        if rc != 0:
            raise HostError(f"cannot make the log directory of {log_path} on {self._ssh.target.display}: "
                            f"{err.decode(errors='replace').strip()[:200]}")

    async def read(self, path: str) -> str | None:
        _, out, _ = await self._ssh.run_op(_remote.EXIT_STATUS, path)
        first, _, text = out.partition(b"\n")
        return text.decode(errors="replace") if first.strip() == b"present" else None

    def follow(self, path: str, offset: int, generation: int, poll_s: float) -> Follower:
        return self._ssh.follow(path, offset, generation)


class SharedOrRemoteFiles:
    """Read here where the daemon sees the log root (checked on first use), else over SSH."""

    def __init__(self, ssh: SshHost) -> None:
        self._ssh = ssh
        self._remote = RemoteFiles(ssh)
        self._picked: SlurmFiles | None = None

    async def pick(self) -> SlurmFiles:
        if self._picked is None:
            root = await self._ssh.log_root()
            token = secrets.token_hex(16)
            _, out, _ = await self._ssh.run_op(_PROBE, root, token)
            probe = out.decode(errors="replace").strip()
            try:
                shared = bool(probe) and Path(probe).read_text() == token
            except OSError:
                shared = False
            if probe:
                await self._ssh.run_op("rm -f -- \"$1\"", probe)
            log.info("slurm+ssh log root", host=self._ssh.name, root=root, read_here=shared)
            self._picked = LocalFiles(Path(root)) if shared else self._remote
        return self._picked

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        return await (await self.pick()).log_paths(job, attempt)

    async def prepare(self, log_path: str, status_path: str) -> None:
        await (await self.pick()).prepare(log_path, status_path)

    async def read(self, path: str) -> str | None:
        return await (await self.pick()).read(path)

    def follow(self, path: str, offset: int, generation: int, poll_s: float) -> Follower:
        # Not checked yet (a restarted daemon re-adopting a job follows first): over SSH, through the agent
        # on the login node's Python 3.
        return (self._picked or self._remote).follow(path, offset, generation, poll_s)


class SlurmSshHost(SlurmHost):
    """A Slurm cluster reached through its login node; see the module docstring."""

    def __init__(self, name: str, *, shared: bool | None = None) -> None:
        self.ssh = SshHost(ssh_url(name))
        files: SlurmFiles
        if shared is None:
            files = SharedOrRemoteFiles(self.ssh)
        else:
            files = LocalFiles(Path("/")) if shared else RemoteFiles(self.ssh)
        super().__init__(name, commands=SshSlurmCommands(self.ssh), files=files)

    async def close(self) -> None:
        await super().close()
        await self.ssh.close()
