"""The SSH host's remote agent, exercised in-process: its module is the very text the box runs
(``mux_agent.agent_source()``), so its functions are tested here as functions, and every event
it writes is read back with the daemon's own parser."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from supervisor.hosts import _busy
from supervisor.hosts.ssh import _agent_program as program
from supervisor.hosts.ssh.mux_agent import (
    Data,
    Ended,
    Event,
    Gone,
    Hello,
    Reset,
    Started,
    Stats,
    agent_source,
    parse_event,
)


def _events(out: io.BytesIO) -> list[Event]:
    """The frames written so far, parsed as the daemon parses them (a data frame with its bytes)."""
    stream = io.BytesIO(out.getvalue())
    out.seek(0)
    out.truncate()
    events: list[Event] = []
    while line := stream.readline():
        event = parse_event(line)
        if isinstance(event, Data):
            event = Data(event.id, event.size, stream.read(event.size))
        events.append(event)
    return events


def _agent() -> tuple[program.Agent, io.BytesIO]:
    out = io.BytesIO()
    return program.Agent(out), out


def test_the_text_sent_is_the_module_and_runs_on_the_oldest_python_it_claims() -> None:
    source = agent_source()
    assert source == Path(program.__file__).read_text()
    # Parsed with the grammar of MIN_PYTHON: syntax a newer Python added fails here, not on an old box.
    tree = ast.parse(source, feature_version=program.MIN_PYTHON)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - {"__future__"} <= sys.stdlib_module_names, imported  # nothing of the supervisor, nothing installed


def test_the_agent_batches_with_the_local_follower_s_numbers() -> None:
    assert (program.GATHER_S, program.BUSY_LINES) == (_busy.BUSY_READ_INTERVAL_S, _busy.BUSY_LINES_PER_S)


def test_a_follow_sends_what_the_file_gains_and_restarts_at_zero_when_it_shrinks_or_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"one\ntwo\n")
    agent, out = _agent()
    agent.handle({"op": "follow", "id": 7, "path": str(log), "offset": 4})
    assert _events(out) == [Started(7, 4)]
    assert agent.pump_all(None) == 1
    assert _events(out) == [Data(7, 4, b"two\n")]
    assert agent.pump_all(None) == 0 and _events(out) == []  # nothing new: nothing sent
    with log.open("ab") as handle:
        handle.write(b"three\npartial")
    agent.pump_all(None)
    assert _events(out) == [Data(7, 13, b"three\npartial")]
    log.write_bytes(b"x\n")  # truncated
    agent.pump_all(None)
    assert _events(out) == [Reset(7), Data(7, 2, b"x\n")]
    replaced = tmp_path / "new.log"
    replaced.write_bytes(b"yy\n")
    os.replace(replaced, log)  # another file under the same name (another inode), even one longer
    agent.pump_all(None)
    assert _events(out) == [Reset(7), Data(7, 3, b"yy\n")]
    agent.handle({"op": "stats"})
    agent.handle({"op": "stop", "id": 7})
    agent.handle({"op": "stats"})
    assert _events(out) == [Stats(1, 0), Stats(0, 0)]


def test_an_offset_past_the_end_is_another_file_and_a_drain_reads_to_the_end_then_ends(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    big = b"".join(f"line {i}\n".encode() for i in range(60_000))  # more than one frame (CHUNK)
    log.write_bytes(big)
    agent, out = _agent()
    agent.handle({"op": "follow", "id": 1, "path": str(log), "offset": len(big) + 10})
    agent.handle({"op": "drain", "id": 2, "path": str(log), "offset": 0})
    agent.handle({"op": "drain", "id": 3, "path": str(tmp_path / "never.log"), "offset": 0})
    started = _events(out)
    assert started == [Started(1, 0), Started(2, 0), Started(3, 0)]
    agent.pump_all(None)
    events = _events(out)
    drained = [e for e in events if isinstance(e, Data) and e.id == 2]
    assert len(drained) > 1 and all(e.size <= program.CHUNK for e in drained)
    assert b"".join(e.data for e in drained) == big
    assert Ended(2) in events and Ended(3) in events
    assert events.index(Ended(2)) > events.index(drained[-1])
    follow = [e for e in events if isinstance(e, Data) and e.id == 1]
    assert len(follow) == 1 and follow[0].data == big[: program.CHUNK]  # a follow: one frame a round, from 0
    assert set(agent.follows) == {1}


def test_alive_tells_a_live_process_from_a_reused_pid_an_ended_one_and_a_zombie(tmp_path: Path) -> None:
    me = Path(f"/proc/{os.getpid()}/stat").read_text().rpartition(") ")[2].split()[19]
    assert program.alive(f"{os.getpid()}:{me}") and program.alive(f"{os.getpid()}:-")
    assert not program.alive(f"{os.getpid()}:{int(me) + 1}")  # the same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().rpartition(") ")[2][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not program.alive(f"{child.pid}:-")  # not reaped: a zombie counts as gone
    child.wait()
    assert not program.alive(f"{child.pid}:-")
    fake = tmp_path / "proc" / "42"
    fake.mkdir(parents=True)
    (fake / "stat").write_text("42 (a) b) S" + " 1" * 18 + " 777 0\n")  # a command name holding ") "
    assert program.alive("42:777", str(tmp_path / "proc")) and not program.alive("42:778", str(tmp_path / "proc"))


def test_watched_processes_are_reported_gone_once(tmp_path: Path) -> None:
    agent, out = _agent()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    agent.handle({"op": "watch", "key": f"{child.pid}:-"})
    agent.handle({"op": "watch", "key": f"{os.getpid()}:-"})
    agent.check_exits()
    agent.check_exits()
    assert _events(out) == [Gone(f"{child.pid}:-")]
    assert agent.watches == {f"{os.getpid()}:-"}


def test_inotify_events_name_their_directories_and_an_overflow_means_all() -> None:
    def event(wd: int, mask: int, name: bytes = b"") -> bytes:
        padded = name.ljust(16, b"\0") if name else b""
        return program._IN_EVENT.pack(wd, mask, 0, len(padded)) + padded

    by_wd = {1: "/logs/a", 2: "/logs/b"}
    assert program.touched_dirs(event(1, 0x2, b"job.log") + event(2, 0x100) + event(9, 0x2), by_wd) == {
        "/logs/a", "/logs/b", None}
    assert program.touched_dirs(event(1, 0x2) + event(-1, program._IN_Q_OVERFLOW), by_wd) is None
    assert program.touched_dirs(b"", by_wd) == set()


def test_serve_says_hello_answers_until_its_input_ends_and_sends_a_round_s_frames(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"ready\n")
    read, write = os.pipe()
    requests = [{"op": "follow", "id": 1, "path": str(log), "offset": 0}, {"op": "stats"}]
    os.write(write, b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    os.close(write)
    out = io.BytesIO()
    try:
        program.serve(read, program.Agent(out, program.Inotify()))  # returns when its input ends
    finally:
        os.close(read)
    events = _events(out)
    assert isinstance(events[0], Hello) and events[0].inotify
    assert events[1:] == [Started(1, 0), Stats(1, 0), Data(1, 6, b"ready\n")]
