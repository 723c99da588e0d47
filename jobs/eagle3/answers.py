"""The regeneration's answers on disk: one append-only journal per shard, then the assembled JSONL.

Regeneration of the mission's set is hours of GPU time; written once at the end, a crash, OOM or preemption
lost all of it. So each answer is appended to its shard's journal as it completes, keyed by its prompt
index, and the journal is fsynced every ``fsync_every`` answers (and at the end): a SIGKILL loses at most the
answers after the last fsync that the kernel had not yet been handed, an outage of the machine those since the
last fsync. A relaunch reads the journal and skips what it holds.

Layout, next to ``OUT`` (the file ``eagle3.extract --prompts`` reads): ``OUT.parts/shard-I-of-N.jsonl``.
Its first line is a header (``{"journal": FORMAT, "fingerprint": {...}}``: the model, the prompts and the
sampling settings; a relaunch with others is refused, as mixing answers of two settings would be silent);
each further line ``{"index": i, "token_ids": [...], "loss_mask": [...], "ended": bool}``. A last line cut
short by a kill is dropped (the file is truncated to the last whole line). Each shard's process holds an
exclusive flock on its journal for its life: a second process on the same shard is refused.

``OUT`` is assembled, in prompt order, once every index of the set is in some shard's journal: the records
(``token_ids`` and ``loss_mask``) exactly as an uninterrupted run writes them, atomically (temporary name,
fsync, rename). Journals are kept: they are what tells a later relaunch that the work is done.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _io

FORMAT = "eagle3-regenerate-journal/1"


class JournalError(ValueError):
    """A journal that cannot be continued (other settings, another process, unreadable)."""


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def journal_path(out: Path, shard: int, num_shards: int) -> Path:
    return parts_dir(out) / f"shard-{shard}-of-{num_shards}.jsonl"


@dataclass
class Entry:
    """One answer as the journal holds it."""

    index: int
    token_ids: list[int]
    loss_mask: list[int]
    ended: bool

    def record(self) -> dict[str, Any]:
        """The line of the assembled output (what eagle3.extract reads)."""
        return {"token_ids": self.token_ids, "loss_mask": self.loss_mask}


def read(path: Path, fingerprint: Mapping[str, Any] | None = None) -> tuple[dict[int, Entry], int]:
    """The entries of a journal and the byte length of its whole lines (a torn last line is not counted).

    With ``fingerprint``, a journal made with other settings is refused."""
    data = path.read_bytes()
    entries: dict[int, Entry] = {}
    good = 0
    header: dict[str, Any] | None = None
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break  # cut short by a kill: redone
        try:
            rec = json.loads(raw)
        except ValueError:
            break
        if header is None:
            if not isinstance(rec, dict) or rec.get("journal") != FORMAT:
                raise JournalError(f"{path} is not a regenerate journal: remove it, or use another --out")
            header = rec
        else:
            entries[int(rec["index"])] = Entry(int(rec["index"]), list(rec["token_ids"]), list(rec["loss_mask"]),
                                               bool(rec["ended"]))
        good += len(raw)
    if fingerprint is not None and header is not None:
        prev = header.get("fingerprint") or {}
        diff = [k for k in fingerprint if prev.get(k) != fingerprint[k]]
        if diff:
            raise JournalError(f"{path} holds answers made with other settings (differs in: {', '.join(diff)}); "
                               "use another --out, or remove it to start over")
    return entries, good


class Journal:
    """This shard's journal, open for appending, locked for the life of the process."""

    def __init__(self, path: Path, fingerprint: Mapping[str, Any], fsync_every: int):
        self.path = path
        self.fingerprint = dict(fingerprint)
        self.fsync_every = max(1, fsync_every)
        self._fd = -1
        self._unsynced = 0

    def open(self) -> dict[int, Entry]:
        """Lock the journal, drop a torn last line, write the header if new; the entries it holds."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(f"another regenerate process is writing {self.path}: stop it before "
                               "relaunching") from None
        try:
            entries, good = read(self.path, self.fingerprint)
            if good < os.fstat(fd).st_size:
                os.ftruncate(fd, good)
            if good == 0:
                os.write(fd, (json.dumps({"journal": FORMAT, "fingerprint": self.fingerprint}) + "\n").encode())
                os.fsync(fd)
                _io.fsync_path(self.path.parent)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return entries

    def append(self, entry: Entry) -> None:
        line = json.dumps({"index": entry.index, "token_ids": entry.token_ids, "loss_mask": entry.loss_mask,
                           "ended": entry.ended}) + "\n"
        os.write(self._fd, line.encode())  # one write of a whole line (O_APPEND): nothing interleaves
        self._unsynced += 1
        if self._unsynced >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fsync(self._fd)
            self._unsynced = 0

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


def collected(out: Path, num_shards: int, fingerprint: Mapping[str, Any]) -> tuple[dict[int, Entry], list[int]]:
    """Every shard's entries (read as they stand: a live shard's torn last line is skipped), and the shards
    whose journal is missing."""
    entries: dict[int, Entry] = {}
    missing: list[int] = []
    for k in range(num_shards):
        path = journal_path(out, k, num_shards)
        if not path.exists():
            missing.append(k)
            continue
        entries.update(read(path, fingerprint)[0])
    return entries, missing


def assemble(out: Path, entries: Mapping[int, Entry], total: int) -> None:
    """Write ``out``: the answers of prompts 0..total-1 in order (all must be there)."""
    body = "".join(json.dumps(entries[i].record()) + "\n" for i in range(total))
    _io.atomic_write_bytes(body.encode(), out)


def todo(total: int, shard: int, num_shards: int, done: Sequence[int] | set[int]) -> list[int]:
    """This shard's prompts (index i belongs to shard i mod N) that have no answer yet."""
    have = set(done)
    return [i for i in range(shard, total, num_shards) if i not in have]
