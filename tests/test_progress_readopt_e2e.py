"""A bar's in-place latest row across a daemon restart: the daemon that re-adopts the attempt
keeps replacing the row the killed one stored, so the history keeps one row per milestone and
no stale stand-in (progress_milestones.py).  A real daemon killed with SIGKILL, a real job."""

from __future__ import annotations

import signal
from itertools import pairwise
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

# 1000 steps; at step 505 (five past the 50% milestone, so its latest row is a stand-in) it
# waits for the gate file, then draws the rest.
GATED_BAR_JOB = """\
import os, sys, time
gate = sys.argv[1]
for i in range(0, 1001):
    print(f"train: {i//10}%|###| {i}/1000 [00:00<00:01, 5.0it/s]", flush=True)
    while i == 505 and not os.path.exists(gate):
        time.sleep(0.01)
print("all good", flush=True)
"""


def _progress_rows(daemon: DaemonProcess, job: str) -> list[int]:
    """The counts of the bar's stored progress rows, in the order stored."""
    return [int(e.data["done"]) for e in daemon.client().events(job, kinds=["progress"]).events]


def test_a_bars_latest_row_is_replaced_by_the_daemon_that_re_adopts_it(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("gated", GATED_BAR_JOB, params=f', "{gate}"', probes='["tqdm"]')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: 505 in _progress_rows(daemon, "gated"), timeout=60)
    assert _progress_rows(daemon, "gated")[-2:] == [500, 505]  # the 50% milestone, then its stand-in
    daemon.kill(signal.SIGKILL)
    daemon.start()
    client = daemon.client()
    gate.write_text("go")
    wait_until(lambda: job_state(client, "gated") == "done", timeout=60)
    done = _progress_rows(daemon, "gated")
    percents = [d // 10 for d in done]
    # One row per whole percent, 0 to 100: the stand-in at 505 was replaced, not left beside a
    # second 'first line' the restarted daemon would otherwise store for the same bar.
    assert percents == list(range(101)), done
    assert 505 not in done and done[-1] == 1000, done


# Steps 0..50 (the 5% milestone last, stored at once), a pause shorter than the second between
# saves, then 51..57 at once (no milestone among them: stored with the next save only) and a
# stall: its count is what `status` must show.
STALLING_BAR_JOB = """\
import time
for i in range(0, 51):
    print(f"train: {i//10}%|###| {i}/1000 [00:00<00:01, 5.0it/s]", flush=True)
time.sleep(0.3)
for i in range(51, 58):
    print(f"train: 5%|###| {i}/1000 [00:00<00:01, 5.0it/s]", flush=True)
time.sleep(60)
"""


def test_a_stalled_bars_latest_count_is_stored_though_the_log_went_quiet(
        daemon: DaemonProcess, make_job) -> None:
    """A bar's latest line alone is stored with the offset at most once a second; the reader
    wakes for it when the log goes quiet, or a stall would show the count of a second before it."""
    spec = make_job("stalling", STALLING_BAR_JOB, probes='["tqdm"]')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: _progress_rows(daemon, "stalling")[-1:] == [57], timeout=30)
    attempt = client.status("stalling").jobs[0].attempt
    assert attempt is not None and attempt.state == "running"  # judged on the count it stalled at
    assert attempt.progress is not None and attempt.progress.done == 57
    client.stop("stalling", None)


# An outer bar over files, each file an inner bar of 100 steps, written while no daemon reads
# them: the outer bar's latest line (no milestone: its whole percent stays 0) comes before the
# inner bar's milestones that follow it in the log.
NESTED_BARS_JOB = """\
import os, sys, time
gate = sys.argv[1]
print("waiting for the gate", flush=True)
while not os.path.exists(gate):
    time.sleep(0.01)
for f in range(1, 21):
    print(f"files: {f * 100 // 10000}%|   | {f}/10000 [00:00<00:01, 5.0it/s]", flush=True)
    for s in range(0, 101):
        print(f"steps: {s}%|###| {s}/100 [00:00<00:01, 5.0it/s]", flush=True)
print("all good", flush=True)
"""


def test_events_after_a_restarts_catch_up_are_listed_in_log_order(daemon: DaemonProcess, make_job,
                                                                  home: Path) -> None:
    gate = home / "gate"
    spec = make_job("two", NESTED_BARS_JOB, params=f', "{gate}"', probes='["tqdm"]')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("two").jobs[0].last_output_age_s is not None, timeout=30)
    log = Path(client.status("two").jobs[0].attempt.log_path)
    daemon.kill(signal.SIGKILL)
    gate.touch()  # the whole of both bars is written while no daemon reads: the catch-up reads it
    wait_until(lambda: "all good" in log.read_text(), timeout=30)
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "two") == "done", timeout=60)
    progress = client.events("two", kinds=["progress"]).events
    offsets = [e.offset for e in progress]
    inversions = sum(1 for a, b in pairwise(offsets) if a is not None and b is not None and b < a)
    assert inversions == 0, (inversions, len(offsets))
    for bar, last in (("files", 20), ("steps", 100)):  # each bar's rows end at its last count
        assert [int(e.data["done"]) for e in progress if e.data.get("desc") == bar][-1] == last
