"""A job's page on a long history (150,000 stored events): the daemon sends the latest events and
milestones and counts the rest, read off its loop; it never replays the whole history."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import PROGRESS_JOB, job_state

from supervisor.core import protocol

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HISTORY = 150_000
FAILURES = 3000  # milestones: more than a page's worth of them too
REPLAYED = 2000  # the page's list shows as many (docs/guides/web.md)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _add_history(db: Path, job: str) -> None:
    """A long run's stored history: progress events, with a failure every 50th."""
    now = time.time() - HISTORY
    rows = [(job, 1, now + i, "failure" if i % 50 == 0 else "progress", "p", None, 10_000 + i, 0, f"line {i}",
             json.dumps({"done": i} if i % 50 else {"failure": "unknown"}))
            for i in range(HISTORY)]
    with sqlite3.connect(db) as conn:  # the daemon is stopped meanwhile: its store, written as it writes it
        conn.executemany("INSERT INTO events(job, attempt, ts, kind, probe, phase, log_offset, log_generation, "
                         "message, data_json) VALUES(?,?,?,?,?,?,?,?,?,?)", rows)


def _page_feed(base: str, token: str, job: str) -> tuple[list[dict], dict | None]:
    """The job page's feed from its start up to its first status: the events and the summary sent."""
    events: list[dict] = []
    summary = None
    with httpx.stream("GET", f"{base}/api/stream?job={job}&after=0", headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as feed:
        kind = None
        for line in feed.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: ") and kind == "job-event":
                events.append(json.loads(line[len("data: "):]))
            elif line.startswith("data: ") and kind == "summary":
                summary = json.loads(line[len("data: "):])
            elif line.startswith("data: ") and kind == "status":
                return events, summary
    raise AssertionError("the feed ended before its first status")


def test_a_long_history_is_sent_bounded_with_a_count_of_the_rest(daemon: DaemonProcess, make_job, home: Path) -> None:
    client = daemon.client()
    client.start(str(make_job("long", PROGRESS_JOB, params=', "3", "0.01"')), {})
    wait_until(lambda: job_state(client, "long") == "done")
    own = len(client.events("long").events)
    daemon.stop()
    _add_history(home / "supervise.db", "long")
    daemon.start()
    client = daemon.client()
    port = _free_port()
    token = client.web(protocol.WebRequest(port=port)).url.rsplit("token=", 1)[1]

    events, summary = _page_feed(f"http://127.0.0.1:{port}", token, "long")
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids)) and len(ids) <= 2 * REPLAYED  # bounded, in order, none twice
    with sqlite3.connect(home / "supervise.db") as conn:
        latest = [r[0] for r in conn.execute("SELECT id FROM events WHERE job='long' ORDER BY id DESC LIMIT ?",
                                             (REPLAYED,))]
    assert set(latest) <= set(ids)  # the latest events are all there
    failures = [e for e in events if e["kind"] == "failure"]
    assert len(failures) == REPLAYED  # the latest milestones, a page of them
    assert summary is not None
    sent_or_counted = len(events) + sum(summary["left_out"].values())
    assert sent_or_counted == HISTORY + own  # every stored event is sent or counted
    assert summary["left_out"]["failure"] == FAILURES - REPLAYED
    assert client.ping() is not None
