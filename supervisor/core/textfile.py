"""Reading a job spec or a probe pack from disk: a regular file, size-capped, never blocking.

A FIFO given as a spec or pack path blocked the reader until some writer appeared, and
`/dev/zero` was read until memory ran out; both froze the daemon.  So the file is opened
with O_NONBLOCK (opening a FIFO then returns at once), checked with fstat to be a regular
file, and read no further than a cap far above any real spec or pack (the largest built-in
pack is 12 KiB).  Problems are raised as the caller's error class, one line each.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from supervisor.core.errors import SuperviseError, one_line

MAX_INPUT_BYTES = 1 << 20


def read_toml(path: Path, what: str, error: type[SuperviseError], limit: int = MAX_INPUT_BYTES) -> dict[str, Any]:
    """The TOML document at ``path``; ``what`` ("job spec", "probe pack") names it in errors."""
    return parse_toml(read_text(path, what, error, limit), path, what, error)


def parse_toml(text: str, path: Path, what: str, error: type[SuperviseError]) -> dict[str, Any]:
    """The TOML document ``text``, read from ``path``."""
    # Imported here: `supervise probe` reads its packs from what it keeps (`probes/_packcache.py`), no TOML.
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {one_line(str(exc))}") from None
    except RecursionError:
        raise error(f"{path}: {what} is nested too deeply (arrays or tables inside each other)") from None


def read_text(path: Path, what: str, error: type[SuperviseError], limit: int = MAX_INPUT_BYTES) -> str:
    return decode_text(read_bytes(path, what, error, limit), path, what, error)


def decode_text(data: bytes, path: Path, what: str, error: type[SuperviseError]) -> str:
    """``data``, read from ``path``, as UTF-8 text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: {what} is not UTF-8 text") from None


def read_bytes(path: Path, what: str, error: type[SuperviseError], limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except ValueError:  # an embedded NUL: no such path can exist
        raise error(f"cannot read {what}: its path contains a NUL character") from None
    try:
        return _read_regular(fd, path, what, error, limit)
    finally:
        os.close(fd)


def _read_regular(fd: int, path: Path, what: str, error: type[SuperviseError], limit: int) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: {what} is not a regular file ({_file_type(info.st_mode)}); give a .toml file")
    too_big = error(f"{path}: {what} is larger than {limit} bytes; is this the right file?")
    if info.st_size > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, limit + 1 - size):  # the file may grow while we read: never past the cap
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise too_big
    return b"".join(chunks)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
