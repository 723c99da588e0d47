"""A long bar under a real daemon: its milestones are stored, not each redraw, while `status`
still shows the true count and `events` the bar's first and last step (progress_milestones.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.core.config import Paths

# tqdm itself, redrawn at every step (no rate limit): 20,001 redraws in a second or two.
FAST_BAR_JOB = """\
import sys
from tqdm import tqdm
for _ in tqdm(range(20_000), desc="train", file=sys.stdout, mininterval=0, miniters=1):
    pass
print("all good", flush=True)
"""


def _progress_rows(home: Path, job: str) -> int:
    with sqlite3.connect(Paths(home).db) as db:
        return db.execute("SELECT COUNT(*) FROM events WHERE job = ? AND kind = 'progress'", (job,)).fetchone()[0]


def test_a_fast_20000_step_bar_stores_its_milestones_only(daemon: DaemonProcess, make_job, home: Path,
                                                         daemon_env: dict[str, str]) -> None:
    spec = make_job("fast", FAST_BAR_JOB, probes='["tqdm"]')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "fast") == "done", timeout=60)
    rows = _progress_rows(home, "fast")
    assert 100 <= rows <= 150, rows  # the first step, each whole percent, the last: not 20,001
    attempt = client.attempts("fast").attempts[0]
    assert attempt.progress is not None and (attempt.progress.done, attempt.progress.total) == (20_000, 20_000)
    status = supervise(daemon_env, "status", "fast").stdout
    assert "20000/20000" in status, status
    events = supervise(daemon_env, "events", "fast", "--kind", "progress", "-n", "1000").stdout
    lines = [line for line in events.splitlines() if "/20000" in line]
    assert len(lines) == rows, events
    assert "0/20000" in lines[0] and "20000/20000" in lines[-1], (lines[0], lines[-1])


def test_start_follow_piped_prints_a_fast_bar_per_whole_percent(daemon: DaemonProcess, make_job,
                                                              daemon_env: dict[str, str]) -> None:
    # Piped (not a terminal): the 20,001 redraws come out as the bar's milestones, about one line
    # per whole percent (at most one a second between them), ending with the true count.
    spec = make_job("piped", FAST_BAR_JOB, probes='["tqdm"]')
    out = supervise(daemon_env, "start", str(spec), "--follow").stdout
    lines = [line for line in out.splitlines() if "/20000" in line]
    assert 100 <= len(lines) <= 150, len(lines)
    assert "\r" not in out and "20000/20000" in lines[-1], lines[-3:]
    percents = [int(line.split("/20000")[0].rsplit(" ", 1)[-1]) * 100 // 20000 for line in lines]
    assert len(percents) - len(set(percents)) <= 5, lines  # a repeat only where a second passed
