"""The kernel log's word on OOM kills: which of a set of pids its OOM killer ended.

Read from ``/dev/kmsg`` without blocking (one record per read, EAGAIN at its end) where this
process may read it (root, or ``kernel.dmesg_restrict = 0``); elsewhere it says nothing, and
a SIGKILL the supervisor did not send stays ``killed``, never a guessed ``oom``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

# "Out of memory: Killed process 4242 (python) total-vm:…" (older kernels: "Kill process"), and
# "Memory cgroup out of memory: Killed process 4242 (python) …" for a cgroup's limit.
_KILLED = re.compile(r"Kill(?:ed)? process (\d+) \(([^)]*)\)")
_MAX_RECORDS = 200_000  # a bound on one scan of the ring buffer


def oom_killed(pids: set[int], kmsg: str = "/dev/kmsg") -> str | None:
    """The kernel's line for an OOM kill of one of ``pids`` (None: no such line, or the log is
    not readable here)."""
    if not pids:
        return None
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        for _ in range(_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while read: go on with the next one
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            text = record.decode("utf-8", "replace").partition(";")[2].strip()
            match = _KILLED.search(text)
            if match and int(match.group(1)) in pids:
                found = text
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return found
