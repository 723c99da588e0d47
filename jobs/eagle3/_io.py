"""Atomic writes of safetensors and JSON files, the completeness check, and test hooks.

Every file this job writes goes to a temporary name in the destination directory
(``.NAME.tmp-PID@HOST``), is flushed and fsynced, and is then ``os.replace``d onto its final name,
so a reader (or a relaunch) sees either the old file, no file, or the complete new file.
Leftover temporaries from a killed run are removed by :func:`remove_temp_files` at start; a temporary
whose writer is still running (another shard on the same ``--out``) is left alone.

A file that is already complete elsewhere (a vLLM staged file, another output's sample) is put into
place without being written again by :func:`place_file`: fsynced, then renamed (or hard-linked via
a temporary name) onto its final name; across filesystems, or where linking is refused, it is copied
(temporary + fsync + rename). :data:`stats` counts the bytes these helpers write and the files
renamed, linked and copied.

A write that fails with ``ENOSPC``/``EDQUOT`` removes its temporary and raises
:class:`DiskFull`, which the CLI turns into one clear line and exit code 75.

Test hooks (environment variables, read at each write; for tests only, never set in production):

* ``EAGLE3_FAULT_ENOSPC_AFTER=N``: after N sample files have been written by this process, the
  next sample write fails with ``ENOSPC`` after writing part of its temporary file.
* ``EAGLE3_FAULT_SIGKILL_AFTER=N``: after N sample files have been written by this process, the
  next sample write writes part of its temporary file and then SIGKILLs its own process.
* ``EAGLE3_FAULT_BATCH_DELAY_S=X``: the extraction loop sleeps X seconds after each batch, so that
  an outside killer can land between batches.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"

_samples_written = 0  # sample files written by this process (for the test hooks)
_lock = threading.Lock()
# Bytes written through these helpers, and files put into place without rewriting them.
stats = {"bytes_written": 0, "renamed": 0, "linked": 0, "copied": 0, "bytes_copied": 0}
# errnos of a hard link that cannot be made here (another filesystem, no links, too many links).
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES, errno.ENOSYS}


class DiskFull(OSError):
    """The disk (or quota) filled up while writing ``path``."""

    def __init__(self, path: str | os.PathLike[str], cause: OSError | None = None):
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.path = str(path)
        self.__cause__ = cause


def _is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


# A temporary of a writer on another host (shards on a shared filesystem) is left alone for this long: no pid
# of this host says whether it is still written; a day untouched is past any one file's write.
FOREIGN_TEMP_S = 24 * 3600
_HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def temp_tag() -> str:
    """This writer's part of a temporary's name, after ``TMP_MARK``: ``PID@HOST``."""
    return f"{os.getpid()}@{_HOST}"


def temp_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p.with_name(f".{p.name}{TMP_MARK}{temp_tag()}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_gone(path: str | os.PathLike[str]) -> bool:
    """Whether the process that named this temporary (``….tmp-PID@HOST``; ``….tmp-PID`` of older
    releases) has ended.

    Shards of one extraction share an output directory and start at different times: a start-up
    cleanup that removed every temporary would delete a running shard's file between its write and
    its rename, and that shard would fail on a file it had just written. On this host the pid says
    whether its writer runs; another host's temporary is left until it is ``FOREIGN_TEMP_S`` old. A
    name with no readable pid is a leftover of no one.
    """
    p = Path(path)
    pid_part, _, host = p.name.rsplit(TMP_MARK, 1)[-1].partition("@")
    pid = pid_part.split("-", 1)[0]
    if not pid.isdigit() or int(pid) <= 0:
        return True
    if host and host != _HOST:
        try:
            return time.time() - p.stat().st_mtime > FOREIGN_TEMP_S
        except OSError:
            return False  # gone already, or not ours to read: nothing to remove
    return int(pid) != os.getpid() and not pid_alive(int(pid))


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file (its data) or a directory (the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hook_count(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def batch_delay() -> None:
    """Test hook: sleep ``EAGLE3_FAULT_BATCH_DELAY_S`` seconds (no-op when unset)."""
    v = os.environ.get("EAGLE3_FAULT_BATCH_DELAY_S")
    if v:
        time.sleep(float(v))


def atomic_write_bytes(data: bytes, path: str | os.PathLike[str], *, sample: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename + directory fsync).

    ``sample=True`` marks a per-sample output file (counted for the test hooks).
    """
    global _samples_written
    path = Path(path)
    tmp = temp_path(path)
    enospc_after = _hook_count("EAGLE3_FAULT_ENOSPC_AFTER") if sample else None
    kill_after = _hook_count("EAGLE3_FAULT_SIGKILL_AFTER") if sample else None
    try:
        with open(tmp, "wb") as f:
            if enospc_after is not None and _samples_written >= enospc_after:
                f.write(data[: len(data) // 2])
                f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
            if kill_after is not None and _samples_written >= kill_after:
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
        _add("bytes_written", len(data))
    except OSError as e:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if _is_disk_full(e):
            raise DiskFull(path, e) from e
        raise
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    if sample:
        with _lock:
            _samples_written += 1


def _add(key: str, n: int = 1) -> None:
    with _lock:
        stats[key] += n


def _sample_hooks(path: Path) -> None:
    """The ENOSPC and SIGKILL test hooks for a sample put into place without a write."""
    enospc_after = _hook_count("EAGLE3_FAULT_ENOSPC_AFTER")
    if enospc_after is not None and _samples_written >= enospc_after:
        raise DiskFull(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)))
    kill_after = _hook_count("EAGLE3_FAULT_SIGKILL_AFTER")
    if kill_after is not None and _samples_written >= kill_after:
        os.kill(os.getpid(), signal.SIGKILL)


def _copy(src: Path, path: Path) -> None:
    """Copy ``src`` onto ``path`` atomically (temporary + fsync + rename + directory fsync)."""
    tmp = temp_path(path)
    try:
        shutil.copyfile(src, tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException as e:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and _is_disk_full(e):
            raise DiskFull(path, e) from e
        raise
    size = path.stat().st_size
    _add("copied")
    _add("bytes_copied", size)
    _add("bytes_written", size)


def place_file(src: str | os.PathLike[str], path: str | os.PathLike[str], *, move: bool,
               sample: bool = False) -> str:
    """Put the complete file ``src`` at ``path`` atomically without rewriting it.

    ``move=True`` renames it (``src`` is gone afterwards), ``move=False`` hard-links it (``src`` stays).
    Where that cannot be done (another filesystem, links refused) the file is copied instead.
    Returns ``"renamed"``, ``"linked"`` or ``"copied"``. ``sample=True`` counts it for the test hooks.
    """
    global _samples_written
    src, path = Path(src), Path(path)
    if sample:
        _sample_hooks(path)
    how = "copied"
    if move:
        fsync_path(src)  # its data on disk before its name appears
        try:
            os.replace(src, path)
            how = "renamed"
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            _copy(src, path)
            src.unlink(missing_ok=True)
    else:
        tmp = temp_path(path)
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
            os.replace(tmp, path)
            how = "linked"
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno not in _NO_LINK:
                raise
            _copy(src, path)
    if how != "copied":
        fsync_path(path.parent)
        _add(how)
    if sample:
        with _lock:
            _samples_written += 1
    return how


def atomic_save_safetensors(tensors: dict[str, Any], path: str | os.PathLike[str], *,
                            metadata: dict[str, str] | None = None, sample: bool = False) -> None:
    """Serialise ``tensors`` (torch tensors) with safetensors and write them atomically."""
    from safetensors.torch import save

    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    atomic_write_bytes(data, path, sample=sample)


def atomic_write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write_bytes((json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), path)


def remove_temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove leftover temporaries (``.NAME.tmp-PID@HOST``) in ``directory`` whose writer has ended."""
    removed = []
    d = Path(directory)
    if not d.is_dir():
        return removed
    for p in d.iterdir():
        if p.name.startswith(".") and TMP_MARK in p.name and p.is_file() and writer_gone(p):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON header of a safetensors file if the file is complete, else None.

    Complete means: the header parses and the file is exactly as long as the header says
    (8-byte length + header + the end of the last tensor's data).
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000 or 8 + n > size:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    end = 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        try:
            end = max(end, int(v["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return None
    return header if size == 8 + n + end else None


def sample_file_ok(path: str | os.PathLike[str], seq_len: int | None = None,
                   n_layers: int | None = None, hidden: int | None = None) -> bool:
    """True when ``path`` is a complete per-sample file (with the expected shapes if given).

    ``loss_mask`` is optional: a file without it (a vLLM staged file renamed into place) takes its
    loss mask from the output's ``prepared.safetensors``.
    """
    h = safetensors_header(path)
    if h is None:
        return False
    try:
        hs, ids = h["hidden_states"], h["token_ids"]
    except KeyError:
        return False
    if hs.get("dtype") != "BF16" or ids.get("dtype") != "I64" or len(hs.get("shape", ())) != 3:
        return False
    t, nl, hd = hs["shape"]
    if ids.get("shape") != [t] or ("loss_mask" in h and h["loss_mask"].get("shape") != [t]):
        return False
    return ((seq_len is None or t == seq_len) and (n_layers is None or nl == n_layers)
            and (hidden is None or hd == hidden))
