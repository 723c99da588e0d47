"""The SQLite store: schema versioning, events stored once, offsets with their events."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from supervisor.errors import NotFound, StoreError
from supervisor.events import Event, EventKind, Phase
from supervisor.store import SCHEMA_VERSION, AttemptRow, Store


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
    first = store.record_events([probe_event(0), probe_event(10)], offset=20, attempt_fields={"phase": "config"})
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
    store.update_attempt("j", 1, pid=123, failure={"kind": "oom"})
    store.close()
    again = Store(tmp_path / "s.db")
    row = again.live_attempts()[0]
    assert row.pid == 123 and row.failure == {"kind": "oom"}
    assert again.next_attempt_number("j") == 2
