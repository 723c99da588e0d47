"""Where the Slurm host reads its attempts' files: the log root, logs, exit files.

``SlurmFiles`` is what ``SlurmHost`` needs of them; ``LocalFiles`` reads them on this machine,
on a file system shared with the nodes (``slurm:``).  ``slurm+ssh://`` reads them where the
daemon can see them too, else over its SSH host (slurm/ssh.py, ``RemoteFiles``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

from supervisor.hosts.base import Follower, log_paths
from supervisor.hosts.local.follow import LogFollower


class SlurmFiles(Protocol):
    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        """A log and exit-file path pair under the log root that no earlier attempt used."""
        ...

    async def prepare(self, log_path: str, status_path: str) -> None:
        """The log's directory made (sbatch writes the log there) and any stale exit file gone."""
        ...

    async def read(self, path: str) -> str | None:
        """A small file's text (an exit file), or None when it is not there."""
        ...

    def follow(self, path: str, offset: int, generation: int, poll_s: float) -> Follower: ...


class LocalFiles:
    """The files on this machine, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        suffix = 0
        while Path(log_paths(self.root, job, attempt, suffix)[0]).exists():
            suffix += 1
        return log_paths(self.root, job, attempt, suffix)

    async def prepare(self, log_path: str, status_path: str) -> None:
        Path(log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(status_path)  # a stale status must never be read as this attempt's

    async def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def follow(self, path: str, offset: int, generation: int, poll_s: float) -> LogFollower:
        # A shared file system may not deliver inotify events for writes made on a node: poll too.
        return LogFollower(Path(path), offset, generation, poll_interval=poll_s, safety_interval=poll_s)
