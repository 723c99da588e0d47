"""A log truncated under a writer that does not append (`cmd > log` and logrotate's `copytruncate`,
or the job's own `ftruncate`): the writer goes on at its old offset, the gap reads back as NULs,
and the traceback written after it is still read, by a real follower of a real job."""

from __future__ import annotations

from conftest import DaemonProcess, wait_until

TRUNCATING_JOB = """\
import os, sys, time
try:
    raise ValueError("first failure, before the truncation")
except ValueError:
    import traceback; traceback.print_exc(file=sys.stdout)
sys.stdout.flush()
time.sleep(1.0)
os.ftruncate(1, 0)  # stdout is the attempt's log: truncated, the file offset stays where it was
time.sleep(1.0)  # the follower sees the log shrink and starts it again from 0
try:
    raise KeyError("second failure, after the truncation")
except KeyError:
    traceback.print_exc(file=sys.stdout)  # logged, and the job goes on to fail otherwise
sys.stdout.flush()
sys.exit(3)
"""


def test_a_traceback_written_after_a_truncation_is_read(daemon: DaemonProcess, make_job) -> None:
    spec = make_job("trunc", TRUNCATING_JOB, extra="[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("trunc").jobs[0].state == "failed", timeout=30)
    failures = [e for e in client.events("trunc").events if e.kind == "failure"]
    messages = [e.message for e in failures]
    assert any("first failure" in m for m in messages), messages
    [second] = [e for e in failures if "second failure" in e.message]
    # Read as the traceback it is, from its first line: no NUL of the hole in front of it.
    assert second.failure is not None and second.failure.kind == "key_error", second
    assert (second.failure.traceback or "").startswith("Traceback (most recent call last):"), second.failure
    assert not any("\x00" in e.message for e in client.events("trunc").events)
