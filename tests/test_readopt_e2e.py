"""A daemon killed (SIGKILL) and started again: the attempt it re-adopts keeps its true rate,
its deadlines run from its true last progress, and its history says the daemon restarted and
for how long it was down.  A real daemon process, real jobs."""

from __future__ import annotations

import signal
import statistics
import time
from itertools import pairwise
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import PROGRESS_JOB, job_state

from supervisor.cli.client import Client


def _progress(client: Client, job: str) -> dict[int, float]:
    """done -> stored time of the progress event that said it."""
    return {int(e.data["done"]): e.ts for e in client.events(job, kinds=["progress"]).events}


def _rate(client: Client, job: str) -> float | None:
    attempt = client.status(job).jobs[0].attempt
    return None if attempt is None or attempt.progress is None else attempt.progress.rate_s_per_it


def test_restart_keeps_the_stall_clock_and_the_rate_and_says_how_long_it_was_down(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    # 0.2 s/it; halfway (20/40) it holds until the gate file exists: stalled since its 20th step.
    gate = home / "gate"
    spec = make_job("steady", PROGRESS_JOB, params=f', "40", "0.2", "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    last_step_at = wait_until(lambda: _progress(client, "steady").get(20))
    assert isinstance(last_step_at, float)
    wait_until(lambda: time.time() - last_step_at > 2.0)  # it has not moved for 2 s
    killed_at = time.time()
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - killed_at > 1.0)  # down for at least 1 s
    daemon.start()
    up_at = time.time()
    client = daemon.client()

    # The stall rule's clock runs from the 20th step, not from the restart.
    status = client.status("steady").jobs[0]
    still_for = time.time() - last_step_at
    upcoming = status.next_verdict
    assert upcoming is not None and upcoming.verdict == "stalled" and upcoming.bound_s is not None, upcoming
    measured = upcoming.bound_s - upcoming.in_s
    assert abs(measured - still_for) < 0.5, (measured, still_for)
    assert status.last_output_age_s is not None and status.last_output_age_s > still_for - 0.5

    # One event says the daemon restarted and for how long: from its last heartbeat (2 s apart) on.
    restarted = client.events("steady", kinds=["daemon_restarted"]).events
    assert len(restarted) == 1, restarted
    down_s = restarted[0].data["down_s"]
    assert up_at - killed_at - 0.1 <= down_s + 0.1 and down_s <= time.time() - killed_at + 2.5, (down_s, up_at - killed_at)
    assert "re-adopted; the daemon was down for" in status.reason, status.reason

    # Moving again, its rate is the true one (0.2 s/it), neither 0 nor many times too fast.
    gate.write_text("go")
    wait_until(lambda: max(_progress(client, "steady")) >= 26, timeout=30)
    rate = _rate(client, "steady")
    assert rate is not None and 0.1 < rate < 0.4, rate
    wait_until(lambda: job_state(client, "steady") == "done", timeout=30)


def test_the_log_written_while_the_daemon_was_down_keeps_its_own_times(daemon: DaemonProcess, make_job) -> None:
    # 0.05 s/it for 12 s: while the daemon is down for 1.5 s, some 30 steps go unwatched.
    spec = make_job("busy", PROGRESS_JOB, params=', "240", "0.05"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: len(_progress(client, "busy")) >= 10)
    killed_at = time.time()
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - killed_at > 1.5)
    daemon.start()
    up_at = time.time()
    client = daemon.client()
    wait_until(lambda: max(_progress(client, "busy")) >= 80, timeout=30)

    rate = _rate(client, "busy")
    assert rate is not None and 0.025 < rate < 0.1, rate
    steps = _progress(client, "busy")
    unwatched = [ts for ts in steps.values() if killed_at < ts < up_at]
    # Stored with when they were written (by their place in the log), not when they were read.
    # A bar's milestones are stored (each whole percent of 240 steps: every second or third step).
    assert len(unwatched) >= 5, sorted(steps.items())
    done = sorted(steps)
    per_step = [(steps[b] - steps[a]) / (b - a) for a, b in pairwise(done)]
    assert 0.025 < statistics.median(per_step) < 0.1, per_step
    wait_until(lambda: job_state(client, "busy") == "done", timeout=30)


# 10,000 quick steps, then 5 slow ones (0.3 s apart), then it holds until the gate file exists.
LONG_THEN_SLOW_JOB = """\
import os, sys, time
gate = sys.argv[1]
for i in range(1, 10_006):
    print(f"Loading checkpoint shards: {i * 100 // 10_010}%|###| {i}/10010 [00:00<00:01, 5.0it/s]", flush=i > 9_990)
    if i > 10_000:
        time.sleep(0.3)
while not os.path.exists(gate):
    time.sleep(0.01)
"""


def test_a_long_history_is_replayed_up_to_its_last_step(daemon: DaemonProcess, make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("long", LONG_THEN_SLOW_JOB, params=f', "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    last_step_at = wait_until(lambda: _progress_tail(client, "long").get(10_005), timeout=60)
    assert isinstance(last_step_at, float)
    daemon.kill(signal.SIGKILL)
    daemon.start()
    client = daemon.client()
    upcoming = client.status("long").jobs[0].next_verdict
    assert upcoming is not None and upcoming.verdict == "stalled" and upcoming.bound_s is not None, upcoming
    # Measured from step 10,005, not from an earlier one the first page of events ends with.
    assert abs((upcoming.bound_s - upcoming.in_s) - (time.time() - last_step_at)) < 0.4, upcoming
    gate.write_text("go")
    wait_until(lambda: job_state(client, "long") == "done", timeout=30)


def _progress_tail(client: Client, job: str) -> dict[int, float]:
    events = client.events(job, kinds=["progress"]).events
    while len(events) == 10_000:  # a page: ask for the next
        more = client.events(job, kinds=["progress"], after=events[-1].id).events
        if not more:
            break
        events = more
    return {int(e.data["done"]): e.ts for e in events}


def test_a_stall_that_came_due_while_the_daemon_was_down_is_judged_at_once(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    gate = home / "gate"  # never written: it holds at 10/20 for good
    spec = make_job("stuck", PROGRESS_JOB, params=f', "20", "0.05", "{gate}"',
                    extra="[health]\nstall_floor_s = 4\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: _progress(client, "stuck").get(10))
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - _progress_at(home, "stuck", 10) > 5.0, timeout=30)  # overdue by 1 s
    daemon.start()
    client = daemon.client()
    verdicts = wait_until(lambda: client.events("stuck", kinds=["verdict"]).events)
    restarted = client.events("stuck", kinds=["daemon_restarted"]).events
    assert isinstance(verdicts, list) and "stalled" in verdicts[0].message, verdicts
    # Judged as soon as it was re-adopted, not a whole stall bound (4 s) after the restart.
    assert verdicts[0].ts - restarted[0].ts < 2.0, (verdicts[0].ts, restarted[0].ts)


def test_a_job_that_moved_while_the_daemon_was_down_is_not_taken_for_stalled(
        daemon: DaemonProcess, make_job) -> None:
    spec = make_job("moving", PROGRESS_JOB, params=', "100", "0.1"',
                    extra="[health]\nstall_floor_s = 2\nstall_k = 3\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: len(_progress(client, "moving")) >= 10)
    killed_at = time.time()
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - killed_at > 3.0)  # longer than its stall bound, while it moves on
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "moving") in ("done", "failed"), timeout=30)
    assert [e.message for e in client.events("moving", kinds=["verdict"]).events] == ["done: exited 0"], \
        client.events("moving", kinds=["verdict"]).events
    assert len(client.attempts("moving").attempts) == 1 and job_state(client, "moving") == "done"


def _progress_at(home: Path, job: str, done: int) -> float:
    """The stored time of a progress step, read from the store while no daemon runs."""
    from supervisor.core.config import Paths
    from supervisor.store.database import Store

    store = Store(Paths(home).db)
    try:
        return next(e.ts for e in store.events(job, kinds=["progress"]) if int(e.data["done"]) == done)
    finally:
        store.close()


# Plain lines no probe reads, 1.2 s apart (each read is stored with its offset: the old daemon
# has read the log to its end), until the first gate file exists, then nothing until the second.
TICKS_JOB = """\
import os, sys, time
quiet, end = sys.argv[1], sys.argv[2]
while not os.path.exists(quiet):
    print("tick", flush=True)
    time.sleep(1.2)
while not os.path.exists(end):
    time.sleep(0.01)
"""


def test_the_silence_clock_runs_from_the_last_line_read_not_from_the_last_event(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    quiet, end = home / "quiet", home / "end"
    spec = make_job("ticks", TICKS_JOB, params=f', "{quiet}", "{end}"',
                    extra="[health]\nsilence_s = 10\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    started = client.status("ticks").jobs[0].attempt.started
    # Longer than its silence bound, all ticks; the bound is longer than a restart takes on a busy machine.
    wait_until(lambda: time.time() - started > 11.0, timeout=30)
    quiet.write_text("")
    log = Path(client.status("ticks").jobs[0].attempt.log_path)
    wait_until(lambda: time.time() - log.stat().st_mtime > 1.5)  # it has gone quiet
    daemon.kill(signal.SIGKILL)
    daemon.start()
    client = daemon.client()
    status = client.status("ticks").jobs[0]
    upcoming = status.next_verdict
    assert status.state == "running" and upcoming is not None and upcoming.verdict == "silent", status
    assert upcoming.bound_s is not None
    assert abs((upcoming.bound_s - upcoming.in_s) - (time.time() - log.stat().st_mtime)) < 0.5, upcoming
    end.write_text("")
    wait_until(lambda: job_state(client, "ticks") == "done", timeout=30)


# Prints a line, then ends (exit 0) once the gate file exists.
GATED_JOB = """\
import os, sys, time
print("working", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def test_an_attempt_that_ended_while_the_daemon_was_down_ends_when_its_command_did(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("gated", GATED_JOB, params=f', "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    row = wait_until(lambda: (a := client.attempts("gated").attempts) and a[0].pid and a[0])
    daemon.kill(signal.SIGKILL)
    gate.touch()
    status_file = Path(_status_path(home, "gated"))
    wait_until(status_file.exists, timeout=30)
    ended_at = status_file.stat().st_mtime
    wait_until(lambda: time.time() - ended_at > 3.0)  # the daemon comes back 3 s after the command ended
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "gated") == "done", timeout=30)
    attempt = client.attempts("gated").attempts[0]
    assert attempt.ended is not None
    # Its end is the exit-status file's time, not the re-adoption's (3 s or more later).
    assert abs(attempt.ended - ended_at) < 0.5, (attempt.ended, ended_at, time.time())
    assert attempt.ended - row.started < time.time() - row.started - 2.5


def _status_path(home: Path, job: str) -> str:
    """The attempt's exit-status path, read from the store while no daemon runs."""
    from supervisor.core.config import Paths
    from supervisor.store.database import Store

    store = Store(Paths(home).db)
    try:
        latest = store.latest_attempt(job)
        assert latest is not None
        return latest.status_path
    finally:
        store.close()


def test_a_backlog_of_many_steps_is_read_whole_before_the_attempt_is_judged(daemon: DaemonProcess, make_job) -> None:
    # About 90 steps a second; the daemon is down 8 s: some 700 lines, more than one step of the
    # reader (256 records), all in one read of the log.  Judged after the first step, the bar's
    # latest step read would be 5 s old, past its 3 s stall bound.
    spec = make_job("fast", PROGRESS_JOB, params=', "2000", "0.01"',
                    extra="[health]\nstall_floor_s = 3\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: len(_progress(client, "fast")) >= 20)
    killed_at = time.time()
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - killed_at > 8.0)
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "fast") in ("done", "failed"), timeout=60)
    assert [e.message for e in client.events("fast", kinds=["verdict"]).events] == ["done: exited 0"]


def _slow_reports(client: Client, job: str, n: int) -> list[str]:
    return [e.message for e in client.events(job, attempt=n, kinds=["action"]).events if e.message.startswith("slow")]


def test_a_slow_step_reported_before_a_daemon_restart_is_not_reported_again_after_it(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    # A first run gives the bar its history (0.05 s a step); the second holds at 10/20, reported slow
    # once its step has lasted the 1 s slow floor.  The daemon restarted within that step re-adopts
    # the attempt: the step is the same, and so is its report (one alert, not one per daemon).
    gate = home / "gate"
    gate.touch()
    spec = make_job("held", PROGRESS_JOB, params=f', "20", "0.05", "{gate}"',
                    extra="[health]\nstall_floor_s = 60\nslow_floor_s = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "held") == "done", timeout=30)
    gate.unlink()
    client.start(str(spec), {})
    first = wait_until(lambda: _slow_reports(client, "held", 2), timeout=30)
    daemon.kill(signal.SIGTERM)
    daemon.start()
    client = daemon.client()
    wait_until(lambda: client.events("held", attempt=2, kinds=["daemon_restarted"]).events, timeout=30)
    time.sleep(3)  # the re-adopted step is long past its slow bound: a second report would come at once
    assert _slow_reports(client, "held", 2) == first
    gate.touch()
    wait_until(lambda: job_state(client, "held") == "done", timeout=30)
