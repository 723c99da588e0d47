"""An ended attempt is judged on its whole log, however long the daemon takes to get to it.

A job floods its log with tqdm redraws, faster than the daemon reads them, then dies with a
traceback.  While the daemon is still reading, it gets no CPU at all for longer than the drain's
bound (SIGSTOP, then SIGCONT: as an overloaded machine, a paused VM or a thrashing host leave it):
the reader was waiting its turn, not stuck, and the attempt must still be judged on the traceback
at the end of its log.  A real daemon, a real job, a real log."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

from supervisor.jobs.runner._watching import DRAIN_STALL_S

# argv: how many redraws.  Written through a full buffer (no flush per line): megabytes in a
# second or two, far ahead of the daemon; then the traceback, and exit 1.
FLOOD_THEN_CRASH_JOB = """\
import sys
n = int(sys.argv[1])
for i in range(1, n + 1):
    sys.stdout.write(f"\\rLoading checkpoint shards: {100 * i // n}%|###| {i}/{n} [00:00<00:01, 5.0it/s]")
sys.stdout.write("\\n")
sys.stdout.flush()
raise KeyError("layers.0.weight_scale")
"""


def _stored(home: Path, job: str) -> tuple[int, str, str]:
    """The attempt's stored log offset, exit-status path and log path."""
    with sqlite3.connect(home / "supervise.db") as db:
        offset, status, log = db.execute("SELECT log_offset, status_path, log_path FROM attempts WHERE job=?",
                                         (job,)).fetchone()
    return int(offset), str(status), str(log)


def test_an_ended_attempt_is_read_to_its_end_though_its_reader_had_no_turn_for_longer_than_the_bound(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    spec = make_job("flood", FLOOD_THEN_CRASH_JOB, params=', "150000"', extra="[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    status = Path(_stored(home, "flood")[1])
    wait_until(status.exists, timeout=60, interval=0.005)
    time.sleep(0.1)  # the daemon has seen the exit: it is reading the rest of the log to judge it
    assert daemon.proc is not None
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        read_to, _, log = _stored(home, "flood")
        size = Path(log).stat().st_size
        assert read_to < size // 2, (read_to, size)  # most of it was still unread when the daemon stopped
        time.sleep(DRAIN_STALL_S + 2)
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    wait_until(lambda: job_state(client, "flood") == "failed", timeout=300)
    attempt = client.attempts("flood").attempts[0]
    read_to = _stored(home, "flood")[0]
    assert read_to == size, f"judged {attempt.reason!r} with {read_to:,} of {size:,} bytes of its log read"
    assert attempt.exit_code == 1 and attempt.failure is not None, attempt.reason
    assert "KeyError" in attempt.failure.line and "layers.0.weight_scale" in attempt.failure.line, attempt.failure
    assert "not read to its end" not in (attempt.reason or ""), attempt.reason
