"""`logs --timestamps`: when each line arrived, as the daemon read it (to within a second), kept
beside the store in one mark per second of arrival, deleted with the attempt's log or its job."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.store.arrivals import Arrivals, ArrivalWriter, marks_path

SLOW_JOB = """\
import time
for i in range(3):
    print(f"line {i}", flush=True)
    time.sleep(1.3)
"""


def test_one_mark_per_second_of_arrival_and_a_line_gets_the_first_mark_at_or_past_its_end(tmp_path: Path) -> None:
    path = tmp_path / "marks" / "job" / "1.bin"
    writer = ArrivalWriter(path)
    writer.arrived(0, 100, 1000.10)
    writer.arrived(0, 250, 1000.90)  # the same second: the mark moves forward
    writer.arrived(0, 400, 1001.20)
    writer.close()
    assert path.stat().st_size == 2 * 20
    marks = Arrivals.read(path)
    assert [marks.time_of(end) for end in (50, 100, 101, 250, 251, 400, 401)] == [
        1000.90, 1000.90, 1000.90, 1000.90, 1001.20, 1001.20, None]
    again = ArrivalWriter(path)  # a re-adopted attempt goes on after what was noted
    again.arrived(0, 500, 1001.70)
    again.arrived(1, 30, 1003.00)  # the log was truncated: only the current generation counts
    again.close()
    marks = Arrivals.read(path)
    assert marks.time_of(30) == 1003.00 and marks.time_of(31) is None
    path.write_bytes(path.read_bytes() + b"\x01\x02")  # a torn last mark is dropped
    assert Arrivals.read(path).time_of(30) == 1003.00
    assert Arrivals.read(tmp_path / "none.bin").time_of(1) is None
    refused = ArrivalWriter(tmp_path / "file-not-dir" / "x.bin")
    (tmp_path / "file-not-dir").write_text("")
    refused.arrived(0, 10, 1.0)  # cannot be written: said once in the daemon's log, never raised
    refused.arrived(0, 20, 2.0)


def test_logs_timestamps_say_when_each_line_arrived(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                    make_job: Callable[..., Path], home: Path) -> None:
    client = daemon.client()
    client.start(str(make_job("slow", SLOW_JOB)), {})
    wait_until(lambda: job_state(client, "slow") == "done", timeout=30)
    attempt = client.attempts("slow").attempts[0]
    lines = supervise(daemon_env, "logs", "slow", "--timestamps").stdout.splitlines()
    assert [line[20:] for line in lines] == ["line 0", "line 1", "line 2"], lines
    stamps = [dt.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S").timestamp() for line in lines]
    assert int(attempt.started) - 1 <= stamps[0] <= stamps[1] <= stamps[2] <= attempt.ended + 1
    assert stamps[2] - stamps[0] >= 2  # 2.6 s apart as written, to the second
    assert supervise(daemon_env, "logs", "slow", "--timestamps", "-n", "1").stdout.splitlines() == lines[-1:]
    assert supervise(daemon_env, "logs", "slow").stdout.splitlines() == ["line 0", "line 1", "line 2"]
    chunks = [c for c in client.follow_log("slow", attempt=None, follow=False, timestamps=True) if not c.end]
    assert all(c.ts is not None and attempt.started - 1 <= c.ts <= attempt.ended + 1 for c in chunks)
    # forgotten with the job
    assert marks_path(home / "arrivals", "slow", 1).is_file()
    supervise(daemon_env, "rm", "slow", "--logs")
    assert not (home / "arrivals" / "slow").exists()


def test_marks_go_with_the_logs_retention_prunes(daemon: DaemonProcess, make_job: Callable[..., Path],
                                                 home: Path) -> None:
    client = daemon.client()
    spec = make_job("twice", "print('once', flush=True)\n")
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "twice") == "done", timeout=30)
    first = marks_path(home / "arrivals", "twice", 1)
    wait_until(first.is_file)
    for n in range(2, 23):  # log_keep_attempts is 20: the first attempt's log and marks go
        client.start(str(spec), {})
        wait_until(lambda n=n: len(client.attempts("twice").attempts) == n and job_state(client, "twice") == "done",
                   timeout=30)
    assert not Path(client.attempts("twice").attempts[0].log_path).exists()
    assert not first.exists() and marks_path(home / "arrivals", "twice", 22).is_file()
    assert client.ping().pid == daemon.proc.pid
