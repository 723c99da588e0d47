"""Who may read the daemon's files: its own user only.

A spec's `env` often holds tokens, and it is stored in the store with the job; job logs hold
whatever a job prints.  Everything else on the machine could read them while the state
directory was 0755 and its files 0644.  Now the state directory and its directories are
0700, its files 0600: the daemon runs under umask 077, the store is created 0600 (SQLite
gives its WAL and shared-memory files the database's mode), the launch wrapper creates each
attempt log under umask 077, and start-up takes group and other access away from whatever
an older daemon left.  Jobs still run under the umask the daemon was started with: what a
job writes (checkpoints, caches) is its user's business.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from supervisor.core.config import Paths
from supervisor.core.errors import StoreError

PRIVATE_UMASK = 0o077
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

log = structlog.get_logger("supervise.filemodes")

_inherited_umask = -1  # the umask before restrict_umask(); -1: unchanged (subprocess's "leave it")


def restrict_umask() -> None:
    """For the daemon process: everything it creates from now on is private to its user."""
    global _inherited_umask
    previous = os.umask(PRIVATE_UMASK)
    if _inherited_umask == -1:
        _inherited_umask = previous


def job_umask() -> int:
    """The umask a job is launched with: the one the daemon was started with (-1: as is)."""
    return _inherited_umask


def secure_state_dir(paths: Paths) -> None:
    """Create the state directory 0700 (and the store 0600), and make what is already there private."""
    try:
        paths.state_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        fd = os.open(paths.db, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)  # empty: a new database
        os.close(fd)
    except OSError as exc:
        raise StoreError(f"cannot create the store {paths.db}: {exc.strerror or exc}") from exc
    _make_private(paths.state_dir)
    for entry in paths.state_dir.iterdir():
        _make_private(entry)
    if paths.logs.is_dir() and not paths.logs.is_symlink():
        for root, dirs, files in os.walk(paths.logs):
            for name in dirs + files:
                _make_private(Path(root) / name)


def _make_private(path: Path) -> None:
    """Take group and other permissions away (a file keeps its owner's bits); never follow a link."""
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o077 or info.st_uid != os.getuid():
            return
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)
    except OSError as exc:  # a file that vanished, or one we may not change: say so, never stop start-up
        log.warning("cannot make private", path=str(path), error=exc.strerror)
