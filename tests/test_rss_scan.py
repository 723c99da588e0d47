"""The sampled peak memory of an attempt looks at every process on the machine each second: a
process found without the attempt's tag is not read again (hosts/local/host.py), and one started
with the tag later is still found."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from supervisor.hosts.base import ProcessHandle
from supervisor.hosts.local import host
from supervisor.hosts.local.host import TAG_VAR, _attempt_processes


def test_processes_without_the_tag_are_read_once_and_a_tagged_newcomer_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = host._has_tag

    def counted(proc: psutil.Process, tag: str) -> bool:
        reads.append(proc.pid)
        return real(proc, tag)

    monkeypatch.setattr(host, "_has_tag", counted)
    tag = f"t-{os.getpid()}-rss"
    handle = ProcessHandle(pid=0, start_time=None, pgid=0, tag=tag, log_path="", status_path="")
    untagged: dict[int, float] = {}
    assert _attempt_processes(handle, None, untagged) == []
    first = len(reads)
    assert first > 0 and len(untagged) >= first - 5  # nearly every process was read, and remembered
    reads.clear()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, TAG_VAR: tag})
    try:
        found = _attempt_processes(handle, None, untagged)
        assert [p.pid for p in found] == [child.pid]
        assert len(reads) < first / 2, (len(reads), first)  # only the newcomers were read
        assert child.pid not in untagged
    finally:
        child.kill()
        child.wait()
    gone = max(psutil.pids()) + 100_000  # no such process
    untagged[gone] = 0.0
    _attempt_processes(handle, None, untagged)
    assert gone not in untagged  # kept to the processes there are
