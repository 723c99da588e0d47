"""The SSH host's remote agent gathers a busy host's lines into few frames.

The agent (``hosts.ssh._agent_program``, sent as ``mux_agent.agent_source()``) runs here as the
real program it is on a remote box, a python3 child speaking its framed protocol over stdin/stdout.
Every frame costs the daemon a wake-up and a batch, so a host whose logs run above ``BUSY_LINES`` lines/s is read at most every
``GATHER_S``; a quiet log is still sent line by line, the moment it is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from supervisor.hosts.ssh.mux_agent import agent_source


def _write(path: Path, lines: int, rate: float) -> None:
    with path.open("a") as out:
        t0 = time.monotonic()
        for n in range(1, lines + 1):
            out.write(f"worker line {n}\n")
            out.flush()
            delay = t0 + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _frames(tmp_path: Path, lines: int, rate: float) -> list[int]:
    """Lines in each data frame the agent sent while ``lines`` were written at ``rate``."""
    log = tmp_path / "job.log"
    log.touch()
    with subprocess.Popen([sys.executable, "-c", agent_source()], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as agent:
        assert agent.stdin is not None and agent.stdout is not None
        try:
            return _read_frames(agent.stdin, agent.stdout, log, lines, rate)
        finally:
            agent.kill()


def _read_frames(stdin: IO[bytes], stdout: IO[bytes], log: Path, lines: int, rate: float) -> list[int]:
    assert json.loads(stdout.readline())["ev"] == "hello"
    stdin.write(json.dumps({"op": "follow", "id": 1, "path": str(log), "offset": 0}).encode() + b"\n")
    stdin.flush()
    assert json.loads(stdout.readline()) == {"ev": "start", "id": 1, "offset": 0}
    writer = threading.Thread(target=_write, args=(log, lines, rate))
    writer.start()
    frames: list[int] = []
    deadline = time.monotonic() + 30
    while sum(frames) < lines and time.monotonic() < deadline:
        msg = json.loads(stdout.readline())
        if msg["ev"] == "data":
            frames.append(stdout.read(msg["n"]).count(b"\n"))
    writer.join()
    return frames


def test_a_busy_host_is_sent_in_few_frames(tmp_path: Path) -> None:
    frames = _frames(tmp_path, 1500, 1000.0)
    assert sum(frames) == 1500
    # 1000 lines/s gathered every 20 ms: ~20 lines a frame (a frame per write before: ~1).
    assert len(frames) <= 1500 / 8, f"{len(frames)} frames for 1500 lines"


def test_a_quiet_log_is_sent_line_by_line(tmp_path: Path) -> None:
    frames = _frames(tmp_path, 20, 40.0)
    assert sum(frames) == 20
    assert max(frames) <= 2, frames


def test_a_data_frame_announcing_more_than_the_agent_ever_sends_is_a_protocol_error() -> None:
    # A frame claiming 2^40 bytes was read as such: 84 -> 332 MB and following stalled.
    from supervisor.hosts.ssh.mux_agent import MAX_FRAME_BYTES, Data, ProtocolError, parse_event

    assert parse_event(b'{"ev": "data", "id": 3, "n": 262144}\n') == Data(3, 262144)
    for size in (2 ** 40, MAX_FRAME_BYTES + 1, -1):
        with pytest.raises(ProtocolError, match="announced a data frame of"):
            parse_event(f'{{"ev": "data", "id": 3, "n": {size}}}\n'.encode())
