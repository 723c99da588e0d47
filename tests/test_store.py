"""The SQLite store: schema versioning, events stored once, offsets with their events."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.core.actions import ActionKind
from supervisor.core.errors import NotFound, StoreError
from supervisor.core.events import AttemptState, Event, EventKind, Failure, FailureKind, JobState, Phase
from supervisor.store.attempt_writes import AttemptUpdate
from supervisor.store.database import SCHEMA_VERSION, AttemptRow, Store


def attempt(job: str = "j", n: int = 1) -> AttemptRow:
    return AttemptRow(job=job, n=n, tag=f"{job}.{n}.x", host="local", argv=["a"], workdir="/", log_path="/l",
                      status_path="/s", pid=None, pgid=None, start_time=None, started=1.0, ended=None,
                      state="running", exit_code=None, exit_signal=None, log_offset=0, phase=None, progress=None,
                      verdict=None, reason=None, failure=None, fingerprint=None, action=None)


def probe_event(offset: int, message: str = "m") -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PHASE, message=message, probe="p.x", phase=Phase.CONFIG, offset=offset)


def test_wal_and_schema_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer than this supervise"):
        Store(tmp_path / "s.db")


def test_events_with_offset_are_stored_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, "running")
    store.add_attempt(attempt())
    first = store.record_events([probe_event(0), probe_event(10)], offset=20, update=AttemptUpdate(phase=Phase.CONFIG))
    assert all(e.id for e in first)
    again = store.record_events([probe_event(10), probe_event(30)], offset=40)
    assert again[0].id is None and again[1].id is not None  # re-read stretch: the duplicate is ignored
    assert [e.offset for e in store.events("j")] == [0, 10, 30]
    row = store.attempt("j", 1)
    assert row.log_offset == 40 and row.phase == "config"
    lifecycle = Event(job="j", attempt=1, kind=EventKind.ACTION, message="a")
    store.record_events([lifecycle, Event(job="j", attempt=1, kind=EventKind.ACTION, message="a")])
    assert len(store.events("j", kinds=["action"])) == 2  # lifecycle events are never deduplicated


def test_unknown_rows_are_not_found(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with pytest.raises(NotFound, match="supervise jobs"):
        store.job("nope")
    with pytest.raises(NotFound):
        store.attempt("nope", 1)


def test_unwritable_location_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        Store(blocker / "sub" / "s.db")


def test_state_survives_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, "running")
    store.add_attempt(attempt())
    oom = Failure(FailureKind.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory.", "fp", "Traceback ...", "ERROR")
    store.update_attempt("j", 1, AttemptUpdate(pid=123, failure=oom))
    store.close()
    again = Store(tmp_path / "s.db")
    row = again.live_attempts()[0]
    assert row.pid == 123 and row.failure == oom
    assert again.next_attempt_number("j") == 2


# ---- failures ---------------------------------------------------------------------------

FAILURE = Failure(FailureKind.KEY_ERROR, "KeyError: 'lm_head.weight'", "ab12", "Traceback ...\nKeyError: 'lm_head.weight'",
                  "ERROR")


def failure_event(failure: Failure) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.FAILURE, message=failure.line, probe="python.traceback",
                 offset=7, data={"rank": 1}, failure=failure)


def test_a_failure_event_reads_back_as_the_same_typed_failure(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {}, "running")
    store.add_attempt(attempt())
    store.record_events([failure_event(FAILURE)])
    (event,) = store.events("j")
    assert event.failure == FAILURE
    assert event.data == {"rank": 1}  # the failure's parts are not left among the data
    # On disk it keeps the shape stores have always had: older readers still find the kind.
    (data_json,) = sqlite3.connect(tmp_path / "s.db").execute("SELECT data_json FROM events").fetchone()
    assert json.loads(data_json) == {"rank": 1, "failure": "key_error", "fingerprint": "ab12",
                                     "traceback": FAILURE.traceback, "level": "ERROR"}


def test_event_and_attempt_rows_in_the_old_shape_still_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {}, "running")
    store.add_attempt(attempt())
    # As written before failures were typed: the probe's fields and the failure's parts in one
    # dict, no level where the header had none; the attempt's failure without a level.
    old_data = {"exc_type": "RuntimeError", "failure": "runtime_error", "fingerprint": "852dcdba",
                "traceback": "Traceback (most recent call last):\nRuntimeError: bad batch"}
    old_failure = {"kind": "runtime_error", "line": "RuntimeError: bad batch", "fingerprint": "852dcdba",
                   "traceback": "Traceback (most recent call last):\nRuntimeError: bad batch"}
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("INSERT INTO events(job, attempt, ts, kind, probe, phase, log_offset, message, data_json) "
               "VALUES('j', 1, 1.0, 'failure', 'python.traceback', NULL, 290, 'RuntimeError: bad batch', ?)",
               (json.dumps(old_data),))
    db.execute("INSERT INTO events(job, attempt, ts, kind, probe, phase, log_offset, message, data_json) "
               "VALUES('j', 1, 2.0, 'failure', 'x.gone', NULL, 300, 'Gone', ?)",
               (json.dumps({"failure": "kind_no_longer_known", "fingerprint": None, "traceback": None}),))
    db.execute("UPDATE attempts SET failure_json=?, fingerprint='852dcdba'", (json.dumps(old_failure),))
    db.commit()
    expected = Failure(FailureKind.RUNTIME_ERROR, "RuntimeError: bad batch", "852dcdba", old_data["traceback"], None)
    first, gone = store.events("j")
    assert first.failure == expected and first.data == {"exc_type": "RuntimeError"}
    assert gone.failure == Failure(FailureKind.OTHER, "Gone")
    assert store.attempt("j", 1).failure == expected


# The schema as version 1 shipped it (the tables the later migrations touch), written out here so
# that the migration is tested against what real old stores hold.
_V1_TABLES = """
CREATE TABLE jobs (name TEXT PRIMARY KEY, spec_json TEXT NOT NULL, state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE attempts (
    job TEXT NOT NULL REFERENCES jobs(name), n INTEGER NOT NULL, tag TEXT NOT NULL UNIQUE, host TEXT NOT NULL,
    argv_json TEXT NOT NULL, workdir TEXT NOT NULL, log_path TEXT NOT NULL, status_path TEXT NOT NULL,
    pid INTEGER, pgid INTEGER, start_time REAL, started REAL NOT NULL, ended REAL, state TEXT NOT NULL,
    exit_code INTEGER, exit_signal INTEGER, log_offset INTEGER NOT NULL DEFAULT 0, phase TEXT,
    progress_json TEXT, verdict TEXT, reason TEXT, failure_json TEXT, fingerprint TEXT, action TEXT,
    PRIMARY KEY (job, n));
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, attempt INTEGER NOT NULL,
    ts REAL NOT NULL, kind TEXT NOT NULL, probe TEXT, phase TEXT, log_offset INTEGER, message TEXT NOT NULL,
    data_json TEXT NOT NULL);
CREATE UNIQUE INDEX events_probe_once ON events(job, attempt, kind, probe, log_offset) WHERE log_offset IS NOT NULL;
PRAGMA user_version=1;
"""


def test_migration_derives_each_old_attempts_run_once(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "s.db")
    db.executescript(_V1_TABLES)
    db.executemany("INSERT INTO jobs VALUES(?, '{}', ?, '', 0, 0)", [("a", "running"), ("b", "failed")])
    # Job a: a run of two (1 relaunched), a run that gave up, one stopped by the user, then a
    # relaunch whose attempt is still running.  Job b: one run of three.
    actions = {("a", 1): "relaunch in 1.0s", ("a", 2): "give up: attempt 2/2 failed", ("a", 3): "stopped by user",
               ("a", 4): "relaunch in 2.0s", ("a", 5): None,
               ("b", 1): "relaunch in 1.0s", ("b", 2): "relaunch in 2.0s", ("b", 3): "give up: attempt 3/3 failed"}
    for (job, n), action in actions.items():
        state = "running" if action is None else "ended"
        db.execute("INSERT INTO attempts(job, n, tag, host, argv_json, workdir, log_path, status_path, started, state, "
                   "action) VALUES(?, ?, ?, 'local', '[]', '/', '/l', '/s', 0, ?, ?)", (job, n, f"{job}{n}", state, action))
    db.commit()
    db.close()
    store = Store(tmp_path / "s.db")
    assert [(r.run, r.run_attempt) for r in store.attempts("a")] == [(1, 1), (1, 2), (2, 1), (3, 1), (3, 2)]
    assert [(r.run, r.run_attempt) for r in store.attempts("b")] == [(1, 1), (1, 2), (1, 3)]
    assert store.next_run_number("a") == 4 and store.next_run_number("nope") == 1
    resumed = store.live_attempts()
    assert [(r.job, r.n, r.run, r.run_attempt) for r in resumed] == [("a", 5, 3, 2)]
    assert resumed[0].state is AttemptState.RUNNING and store.job("b").state is JobState.FAILED
    # Derived once: a later action of any kind changes no run.
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("UPDATE attempts SET action='relaunch in 1.0s', action_kind='relaunch' WHERE job='a' AND n=3")
    db.commit()
    db.close()
    again = Store(tmp_path / "s.db")
    assert [r.run for r in again.attempts("a")] == [1, 1, 2, 3, 3]


def test_migration_reads_each_old_attempts_action_kind_once(tmp_path: Path) -> None:
    """A store from schema 1 on: each ended attempt's kind of action read from its sentence into its
    own column, once; a sentence no version wrote reads as none, an attempt not ended as no kind."""
    db = sqlite3.connect(tmp_path / "s.db")
    db.executescript(_V1_TABLES)
    db.execute("INSERT INTO jobs VALUES('a', '{}', 'failed', '', 0, 0)")
    sentences = ["relaunch in 1.0s", "relaunch", "give up: attempt 2/2 failed", "stopped by user", "none: job done",
                 "requeued by a version from the future", "", None]
    for n, sentence in enumerate(sentences, 1):
        db.execute("INSERT INTO attempts(job, n, tag, host, argv_json, workdir, log_path, status_path, started, state, "
                   "action) VALUES('a', ?, ?, 'local', '[]', '/', '/l', '/s', 0, ?, ?)",
                   (n, f"a{n}", "running" if sentence is None else "ended", sentence))
    db.commit()
    db.close()
    rows = Store(tmp_path / "s.db").attempts("a")
    assert [r.action for r in rows] == sentences  # the sentence stays as it was: the API shows it
    assert [r.action_kind for r in rows] == [ActionKind.RELAUNCH, ActionKind.RELAUNCH, ActionKind.GIVE_UP,
                                             ActionKind.STOP, ActionKind.NONE, ActionKind.NONE, ActionKind.NONE, None]
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("SELECT action_kind FROM attempts WHERE n=3").fetchone()[0] == "give_up"  # stored, not re-read
    db.close()


def test_run_numbers_are_stored_as_given(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, JobState.RUNNING)
    for n, run in ((1, 1), (2, 1), (3, 2)):
        store.add_attempt(replace(attempt(n=n), run=run))
    assert [(r.run, r.run_attempt) for r in store.attempts("j")] == [(1, 1), (1, 2), (2, 1)]
    latest = store.latest_attempt("j")
    assert latest is not None and (latest.run, latest.run_attempt) == (2, 1)
    assert store.attempt("j", 2).run_attempt == 2 and store.next_run_number("j") == 3


def test_a_step_after_a_cancelled_step_says_not_launched_once(tmp_path: Path) -> None:
    from supervisor.core.events import JobState
    from supervisor.jobs.dependencies import readiness

    store = Store(tmp_path / "s.db")
    store.upsert_job("p.work", {}, JobState.FAILED, "attempt 1/1 failed")
    store.upsert_job("p.final", {}, JobState.CANCELLED, "not launched: p.work failed: attempt 1/1 failed")
    found = readiness(store, ["p.final"])
    assert not found.ready and found.cancelled == "p.work failed: attempt 1/1 failed"
    store.close()
