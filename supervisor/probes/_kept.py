"""What the probes work out from their packs, kept on disk between processes.

Every ``supervise probe``, ``doctor`` and daemon start worked out the same things again from
the same packs: the validated packs (``_packcache``) and, from each probe's regex, its
Hyperscan form, its required literals and its form without the optional tail (pure functions
of the pattern, parsed in Python: most of the engine's 0.08 s of CPU for the built-in packs,
0.03 s with them kept; RESULTS §39).
``KeptFile`` keeps such answers in one JSON file of the cache folder (``_hscache.cache_dir``),
``kept`` makes a pure function of a pattern look its answer up there first.

A file is written for one version of the code that works the answers out (``code_digest``:
every module of the probes and what they read), and read back only by that version.
Nothing here may change an answer or make loading fail: a file that is missing, cut short,
altered (its payload's digest is checked), of another version, or a value of the wrong type
(each user decodes its values and a decoding that fails is a miss), and a folder that cannot
be written, all mean "work it out", as without the file.  The folder is made private (0700),
the file is written private (0600) and whole or not at all; it is opened without following a
link and without waiting, under a size cap (``_hscache.read_file``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from supervisor.probes import _hscache

T = TypeVar("T")
_MAX_FILE_BYTES = 16 << 20
_DIGEST_CHARS = 64  # sha256 in hex: of the code, then of the payload, each on a line of its own


class Malformed(Exception):
    """A kept value is not what its user keeps: the entry is not used."""


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """The version of what works the answers out: the probes' modules, the event and text-file
    modules they read, and RE2's library (a pack's limits are RE2's program sizes)."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in [*sorted(here.glob("*.py")), here.parent / "core" / "events.py", here.parent / "core" / "textfile.py"]:
        with contextlib.suppress(OSError):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    with contextlib.suppress(OSError, ImportError, AttributeError, TypeError, ValueError):
        # Found by name, not through re2's private attribute (tests/test_re2_private_names.py bounds those).
        library = importlib.util.find_spec("re2._re2")
        info = os.stat(library.origin)  # type: ignore[union-attr,arg-type]
        digest.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


class KeptFile:
    """Entries (name -> JSON value) kept in one file; the ``keep`` latest put, read once a process."""

    def __init__(self, file_name: str, magic: bytes, keep: int, folder: Path | None = None) -> None:
        self._name = file_name
        self._magic = magic
        self._keep = keep
        self._folder = folder
        self._entries: dict[str, Any] | None = None
        self._dirty = False
        self._lock = threading.Lock()  # engines are built on the loop and in worker threads

    @property
    def path(self) -> Path:
        return (self._folder or _hscache.cache_dir()) / self._name

    def get(self, name: str) -> Any:
        """The value kept as ``name``, or None."""
        with self._lock:
            return self._load().get(name)

    def put(self, name: str, value: Any) -> None:
        """Keep ``value`` as ``name`` (written by ``save``)."""
        with self._lock:
            entries = self._load()
            entries.pop(name, None)
            entries[name] = value  # the last put last: the first to go are the oldest
            while len(entries) > self._keep:
                del entries[next(iter(entries))]
            self._dirty = True

    def save(self) -> None:
        """Write the entries if any was put since (best effort: a write that fails is left undone)."""
        with self._lock:
            if not self._dirty or self._entries is None:
                return
            self._dirty = False
            payload = json.dumps(self._entries, separators=(",", ":")).encode()
        try:
            folder = self.path.parent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kept-", suffix=".tmp")  # 0600
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(self._magic + code_digest().encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
                              + b"\n" + payload)
                os.replace(tmp, self.path)  # whole or not at all, whoever else writes it
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except Exception:  # noqa: BLE001 - a file that cannot be written costs the work, nothing more
            return

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, Any]:
        data = _hscache.read_file(self.path, _MAX_FILE_BYTES)
        start = len(self._magic)
        head = start + 2 * (_DIGEST_CHARS + 1)
        if data is None or not data.startswith(self._magic) or len(data) < head:
            return {}
        payload = data[head:]
        if (data[start : start + _DIGEST_CHARS + 1] != code_digest().encode() + b"\n"
                or data[start + _DIGEST_CHARS + 1 : head - 1] != hashlib.sha256(payload).hexdigest().encode()):
            return {}
        try:
            entries = json.loads(payload)
        except (ValueError, RecursionError):
            return {}
        return entries if isinstance(entries, dict) else {}


# ---- pure functions of a pattern ----------------------------------------------------------

PATTERNS = KeptFile("patterns.cache", b"supervise-patterns-1\n", keep=8192)


def kept(tag: str, encode: Callable[[T], Any], decode: Callable[[Any], T]) -> Callable[[Callable[[str], T]],
                                                                                      Callable[[str], T]]:
    """``function(pattern)``, its answer looked up in ``PATTERNS`` first (as ``tag``) and kept
    there when worked out; ``decode`` raises ``Malformed`` (or ValueError, TypeError) on a
    value that is not one ``encode`` makes.  Answers are written by ``save_patterns``."""

    def wrap(function: Callable[[str], T]) -> Callable[[str], T]:
        @functools.wraps(function)
        def looked_up(pattern: str) -> T:
            name = f"{tag}\0{pattern}"
            raw = PATTERNS.get(name)
            if isinstance(raw, list) and len(raw) == 1:  # [answer]: None is an answer too
                with contextlib.suppress(Malformed, ValueError, TypeError, KeyError):
                    return decode(raw[0])
            answer = function(pattern)
            PATTERNS.put(name, [encode(answer)])
            return answer

        return looked_up

    return wrap


def save_patterns() -> None:
    PATTERNS.save()


def of(value: Any, kind: type[Any]) -> Any:
    """``value`` if it is a ``kind``, else ``Malformed``."""
    if not isinstance(value, kind):
        raise Malformed(kind.__name__)
    return value
