"""Compiled Hyperscan databases kept on disk between processes.

Compiling the built-in packs' database takes 0.1-0.5 s (more on a loaded machine), paid at
every ``supervise probe``, ``supervise doctor`` and daemon start; loading it back takes a
fraction of a millisecond.  A database is kept under ``$XDG_CACHE_HOME/supervise`` (else
``~/.cache/supervise``), named by a digest of what it was compiled from (the Hyperscan
version, every expression and its flags), with the seconds its compile took, so the load-time
bounds are checked as if it had just been compiled.

Nothing here may make reading wrong or fail: a file that is missing, cut short, altered
(its payload's digest is checked before Hyperscan sees it), made by another Hyperscan or for
another CPU (Hyperscan refuses it, and a scratch space is made for it before it is used), or
a directory that cannot be written, all mean "compile it", as without the cache.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_MAGIC = b"supervise-hs-1\n"
# Databases kept, the most recently used first: one per pack set, so a pack being written and
# tried with `probe --pack-file` leaves one file (~200 KB) per edit; older ones are deleted.
KEEP = 8
_HEADER = struct.Struct("<32sd")  # sha256 of the payload, compile seconds


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "supervise"


def key(version: str, expressions: Sequence[str], flags: Sequence[int]) -> str:
    digest = hashlib.sha256(repr((version, list(expressions), list(flags))).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:40]


def load(hyperscan: Any, name: str) -> tuple[Any, float] | None:
    """The database kept as ``name`` and the seconds its compile took, or None."""
    path = cache_dir() / f"hs-{name}.db"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        os.utime(path)  # used now: the last to be deleted
    except OSError:
        pass
    head = len(_MAGIC) + _HEADER.size
    if not data.startswith(_MAGIC) or len(data) <= head:
        return None
    digest, seconds = _HEADER.unpack_from(data, len(_MAGIC))
    payload = data[head:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        db = hyperscan.loadb(payload, hyperscan.HS_MODE_BLOCK)
        hyperscan.Scratch(db)  # refused here, not at the first scan, if this CPU cannot run it
    except Exception:  # noqa: BLE001 - any refusal means: compile it
        return None
    return db, seconds


def store(hyperscan: Any, name: str, db: Any, seconds: float) -> None:
    """Keep ``db`` as ``name`` (best effort: a write that fails is left undone)."""
    try:
        payload = hyperscan.dumpb(db)
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hs-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_MAGIC + _HEADER.pack(hashlib.sha256(payload).digest(), seconds) + payload)
            os.replace(tmp, folder / f"hs-{name}.db")  # whole or not at all, whoever else writes it
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _forget_old(folder)
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs a compile, nothing more
        return


def _forget_old(folder: Path) -> None:
    """Deletes all but the ``KEEP`` most recently used databases."""
    kept = []
    for path in folder.glob("hs-*.db"):
        try:
            kept.append((path.stat().st_mtime, path))
        except OSError:
            continue  # deleted meanwhile by another process
    kept.sort(reverse=True)
    for _, path in kept[KEEP:]:
        path.unlink(missing_ok=True)
