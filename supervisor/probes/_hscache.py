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

Nor may what lies at a file's name be trusted: each file carries the key of what it was
compiled from, checked against the key it is loaded for (a valid database of other patterns
put at the name would read nothing of what the probes look for); it is opened without
following a link and without waiting (a FIFO would hang the reader, a link to /dev/zero fill
its memory), and read only if it is a regular file under a size cap.  Only files that are the
cache's own (its name, its magic) are ever deleted, whatever else shares the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_MAGIC = b"supervise-hs-2\n"
_OWN_MAGIC = b"supervise-hs-"  # how every version of this cache begins its files
# Databases kept, the most recently used first: one per pack set, so a pack being written and
# tried with `probe --pack-file` leaves one file (~200 KB) per edit; older ones are deleted.
KEEP = 8
_HEADER = struct.Struct("<32s32sd")  # sha256 of the key it was compiled for, sha256 of the payload, compile seconds
_MAX_FILE_BYTES = (64 << 20) + 4096  # the largest database the prefilter keeps (MAX_DB_BYTES), and its header
_OWN_NAME = re.compile(r"hs-[A-Za-z0-9_.-]{1,100}\.db")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "supervise"


def key(version: str, expressions: Sequence[str], flags: Sequence[int]) -> str:
    digest = hashlib.sha256(repr((version, list(expressions), list(flags))).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:40]


def load(hyperscan: Any, name: str) -> tuple[Any, float] | None:
    """The database kept as ``name`` (the key of what it was compiled from) and the seconds its
    compile took, or None."""
    data = _read(cache_dir() / f"hs-{name}.db", _MAX_FILE_BYTES)
    head = len(_MAGIC) + _HEADER.size
    if data is None or not data.startswith(_MAGIC) or len(data) <= head:
        return None
    compiled_for, digest, seconds = _HEADER.unpack_from(data, len(_MAGIC))
    payload = data[head:]
    if compiled_for != _key_digest(name) or hashlib.sha256(payload).digest() != digest:
        return None
    try:
        db = hyperscan.loadb(payload, hyperscan.HS_MODE_BLOCK)
        hyperscan.Scratch(db)  # refused here, not at the first scan, if this CPU cannot run it
    except Exception:  # noqa: BLE001 - any refusal means: compile it
        return None
    return db, seconds


def _key_digest(name: str) -> bytes:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()


def read_file(path: Path, limit: int) -> bytes | None:
    """The regular file at ``path`` whole, or None (see ``_read``): for the other caches here."""
    return _read(path, limit)


def _read(path: Path, limit: int, *, prefix: bool = False) -> bytes | None:
    """A regular file whole (marked used now), or None: never through a link, never waiting (a
    FIFO, a device), never a file larger than ``limit``.  ``prefix``: its first ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (not prefix and info.st_size > limit):
            return None
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        if not prefix:
            with contextlib.suppress(OSError):
                os.utime(fd)  # used now: the last to be deleted
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def store(hyperscan: Any, name: str, db: Any, seconds: float) -> None:
    """Keep ``db`` as ``name`` (best effort: a write that fails is left undone)."""
    try:
        payload = hyperscan.dumpb(db)
        folder = cache_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as the other caches in it
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hs-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_MAGIC + _HEADER.pack(_key_digest(name), hashlib.sha256(payload).digest(), seconds) + payload)
            os.replace(tmp, folder / f"hs-{name}.db")  # whole or not at all, whoever else writes it
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _forget_old(folder)
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs a compile, nothing more
        return


def _forget_old(folder: Path) -> None:
    """Deletes all but the ``KEEP`` most recently used databases: files the cache wrote (named
    and begun as it names and begins them), never anything else found in the folder."""
    kept = []
    for path in folder.glob("hs-*.db"):
        if _OWN_NAME.fullmatch(path.name) is None:
            continue
        try:
            info = path.lstat()
        except OSError:
            continue  # deleted meanwhile by another process
        if stat.S_ISREG(info.st_mode) and _read(path, len(_OWN_MAGIC), prefix=True) == _OWN_MAGIC:
            kept.append((info.st_mtime, path))
    kept.sort(reverse=True)
    for _, path in kept[KEEP:]:
        path.unlink(missing_ok=True)
