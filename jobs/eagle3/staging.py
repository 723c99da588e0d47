"""Where vLLM stages hidden-states files: one directory per shard and per launch, owned while it lives.

vLLM's ``ExampleHiddenStatesConnector`` writes each request's file into its ``shared_storage_path`` as the
request finishes; the job takes the files only after ``generate`` returns, so a batch's files lie staged
for as long as its slowest request computes. Shards of one extraction (and a relaunch of one of them) share
``--out``: a launch that emptied one common staging directory at start deleted the files a live shard had
not yet taken (they then counted as failed requests, and enough in a row stopped that shard).

So each launch stages into ``OUT/.staging/shard-I-of-N.<launch>/`` (``<launch>``: pid and a random
part, never reused) and holds an exclusive ``flock`` on ``<dir>/.owner`` for the life of its process: the
kernel drops it when the process ends, however it ends, SIGKILL included. At start-up a launch removes only
the directories whose lock it can take: their owner is gone, and what they hold belongs to no request any
more (request ids are new at every launch). A live owner's directory is never touched. A child process of
the owner that inherited the descriptor by ``fork`` (vLLM's engine core, when it is forked) keeps the lock
held as long as it lives, which is what is wanted: an engine left running can still be writing there.

Files lying directly in ``OUT/.staging`` come from releases that staged there without a directory per
launch; they are removed only when no other extract process holds a lock on ``OUT`` (see :func:`sweep`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

OWNER = ".owner"
CLAIMING = ".claiming-"  # a directory being claimed: made and locked under this name, then renamed
STALE_CLAIM_S = 60.0  # a claim takes microseconds; one this old was cut short by its process's death


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another open file holds one."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # the directory went away meanwhile: its owner removed it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held(path: Path) -> bool:
    """Whether another open file (of any process) holds a flock on ``path``."""
    if not path.exists():
        return False
    fd = _try_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False


def sweep(root: Path, others: Iterable[Path] = ()) -> int:
    """Remove what dead launches left under ``root``; how many entries were removed.

    A directory goes when its ``.owner`` lock can be taken (held while it is removed, so that no launch
    starting at the same moment sweeps it twice). Loose files (older releases' flat staging) go only when
    none of the ``others`` lock files (the other extract processes' locks on ``OUT``) is held.
    """
    if not root.is_dir():
        return 0
    removed = 0
    loose: list[Path] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            loose.append(entry)
            continue
        if entry.name.startswith(CLAIMING) and not _older_than(entry, STALE_CLAIM_S):
            continue  # its lock may not be taken yet: a live claim must not be swept before it
        fd = _try_lock(entry / OWNER)
        if fd is None:
            continue
        try:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)
        removed += 1
    if loose and not any(held(p) for p in others):
        for p in loose:
            p.unlink(missing_ok=True)
            removed += 1
    return removed


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except FileNotFoundError:
        return False


@dataclass
class Staging:
    """This launch's staging directory and the lock that says it is alive."""

    path: Path
    _fd: int

    @classmethod
    def claim(cls, root: Path, shard: int, num_shards: int) -> Staging:
        root.mkdir(parents=True, exist_ok=True)
        name = f"shard-{shard}-of-{num_shards}.{os.getpid()}-{secrets.token_hex(4)}"
        # Made and locked under a name sweeps leave alone, then renamed: no sweep ever sees it unlocked.
        claiming = root / (CLAIMING + name)
        claiming.mkdir()
        fd = _try_lock(claiming / OWNER)
        if fd is None:  # a fresh name nobody else knows: only a broken filesystem lock gets here
            raise RuntimeError(f"cannot lock the new staging directory {claiming}")
        path = root / name
        claiming.rename(path)
        return cls(path, fd)

    def release(self, *, remove: bool) -> None:
        """Give the directory up; with ``remove``, delete it first (its files are all taken or useless)."""
        if self._fd < 0:
            return
        try:
            if remove:
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._fd)
            self._fd = -1
