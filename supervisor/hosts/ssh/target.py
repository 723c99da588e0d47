"""An SSH host's address and the host-key policy its connection follows.

``parse_target`` reads ``ssh://[user@]host[:port][?accept_new_host_key=1&log_root=PATH]``;
``_Client`` is the asyncssh client that accepts an unknown host key only when accept-new
was asked for (OpenSSH's ``accept-new``) and never a changed one.  See ssh.py for the
whole SSH host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import structlog

from supervisor.core.errors import HostError
from supervisor.hosts._asyncssh import asyncssh
from supervisor.hosts.base import ListenAddress

log = structlog.get_logger("supervise.ssh")

ENV_CONFIG = "SUPERVISE_SSH_CONFIG"
ENV_KNOWN_HOSTS = "SUPERVISE_SSH_KNOWN_HOSTS"
ENV_KEY = "SUPERVISE_SSH_KEY"
ENV_ACCEPT_NEW = "SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS"
ENV_LOG_ROOT = "SUPERVISE_SSH_LOG_ROOT"
ENV_RETRY_S = "SUPERVISE_SSH_RETRY_S"
ENV_NVIDIA_SMI = "SUPERVISE_SSH_NVIDIA_SMI"
ENV_PYTHON = "SUPERVISE_SSH_PYTHON"
ENV_KERNEL_LOG = "SUPERVISE_SSH_KERNEL_LOG"  # the box's kernel log command, for Xid lines ("": not read)
ENV_PYSPY = "SUPERVISE_SSH_PYSPY"  # py-spy on the box (default: its PATH, else ~/.local/bin)

DEFAULT_LOG_ROOT = "~/.local/state/supervise/logs"
_TRUE = {"1", "yes", "true", "on"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # what may be passed as a remote environment variable
_QUERY_KEYS = {"accept_new_host_key", "log_root"}


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


def listen_address(url: str) -> ListenAddress | None:
    """The ssh:// kind's reach hook (`hosts/registry.py`): the address a start looks at first.  Only an
    explicit port is tried: without one, the user's ssh config may name another."""
    target = parse_target(url)
    return None if target.port is None else ListenAddress(target.host, target.port, target.display)


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

