"""`status` reads the store in a few queries, however many jobs there are.

Each query hands the GIL back to whichever thread wants it (the matcher's, reading a busy log),
and the loop then waits up to its switch interval (5 ms) to run again: `status` made a query per
job, and with eight busy logs took ~20 ms of the loop on its own.  Every job's latest attempt now
comes in one query, and a stored spec's JSON is decoded once per text.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from supervisor.core.events import JobState
from supervisor.jobs.views import job_status, job_statuses
from supervisor.store.database import AttemptRow, Store

JOBS = 8


def attempt(job: str, n: int, **changes: object) -> AttemptRow:
    row = AttemptRow(job=job, n=n, tag=f"{job}.{n}.x", host="local", argv=["a"], workdir="/", log_path="/l",
                     status_path="/s", pid=None, pgid=None, start_time=None, started=float(n), ended=None,
                     state="running", exit_code=None, exit_signal=None, log_offset=0, phase=None, progress=None,
                     verdict=None, reason=None, failure=None, fingerprint=None, action=None)
    return replace(row, **changes)  # type: ignore[arg-type]


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "s.db")
    for i in range(JOBS):
        name = f"j{i}"
        store.upsert_job(name, {"name": name, "command": ["true"]}, JobState.RUNNING)
        for n in range(1, i % 3 + 2):  # one to three attempts each, over one or two runs
            store.add_attempt(attempt(name, n, run=1 if n < 3 else 2))
    store.upsert_job("never", {"name": "never", "command": ["true"]}, JobState.STARTING)  # no attempt yet
    return store


def test_every_jobs_latest_attempt_in_one_query_is_each_ones_own(tmp_path: Path) -> None:
    store = _store(tmp_path)
    latest = store.latest_attempts()
    assert set(latest) == {f"j{i}" for i in range(JOBS)}  # a job with no attempt has none
    for name, row in latest.items():
        assert row == store.latest_attempt(name)


def test_status_of_many_jobs_is_a_few_queries_and_says_what_each_ones_own_says(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rows = store.jobs()
    queries: list[str] = []
    store._db.set_trace_callback(queries.append)
    together = job_statuses(rows, store, lambda name: None)
    store._db.set_trace_callback(None)
    assert len(queries) <= 2, queries  # the latest attempts; not one query per job
    assert together == [job_status(row, store, None) for row in rows]


def test_a_stored_spec_is_decoded_once_per_text(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = store.job("j1")
    assert store.job("j1").stored is first.stored  # the same text: the same decoded spec
    store.upsert_job("j1", {"name": "j1", "command": ["false"]}, JobState.RUNNING)
    again = store.job("j1")
    assert again.stored is not first.stored and again.stored["command"] == ["false"]
    assert first.stored["command"] == ["true"]  # a row read before keeps what it read
