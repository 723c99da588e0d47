"""Every stored event reads back through the one registry of payloads, from a store of every
schema version, exactly as the hand-written codecs read it (``tests/data/payloads/readings.jsonl``,
written by them: rows in every shape producers wrote, every key a payload reads set to values of
every JSON type, unknown enum values, and data that is no JSON object)."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest
from conftest import DaemonProcess
from e2e_jobs import supervise

from supervisor.core.events import Event, EventKind, JobState
from supervisor.core.payload_codec import REGISTRY, Read, StoredPayload, carried_by
from supervisor.core.payloads import NO_PAYLOAD, ActionData, ProbeFields, StacksData, payload_of
from supervisor.store.database import Store
from supervisor.store.schema import MIGRATIONS

READINGS: list[dict[str, Any]] = [
    json.loads(line) for line in (Path(__file__).parent / "data" / "payloads" / "readings.jsonl").read_text().splitlines()]


def _store_at(path: Path, version: int) -> None:
    """A store as the version whose schema is ``version`` left it, holding every row of READINGS
    (each in an attempt of its own: the migration that thins progress rows keeps a bar's only row)."""
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:version]:
        db.executescript(migration)
    db.execute(f"PRAGMA user_version={version}")
    db.execute("INSERT INTO jobs(name, spec_json, state, created, updated) VALUES('j', '{}', 'done', 0, 0)")
    db.executemany("INSERT INTO events(job, attempt, ts, kind, probe, log_offset, message, data_json) "
                   "VALUES('j', ?, 1.0, ?, 'p.x', NULL, 'm', ?)",
                   [(n, row["kind"], row["data_json"]) for n, row in enumerate(READINGS, 1)])
    db.commit()
    db.close()


@pytest.mark.parametrize("version", range(1, len(MIGRATIONS) + 1))
def test_every_stored_event_reads_back_as_the_hand_written_codecs_read_it(tmp_path: Path, version: int) -> None:
    _store_at(tmp_path / "s.db", version)
    store = Store(tmp_path / "s.db")  # migrated to this version's schema on open
    try:
        events = store.events("j", limit=len(READINGS) + 1)
    finally:
        store.close()
    assert [e.attempt for e in events] == list(range(1, len(READINGS) + 1))  # every row read, none lost
    differ = []
    for event, row in zip(events, READINGS, strict=True):
        # Data that is no JSON object reads as none (where the store used to raise, or hand a list on).
        stored = row.get("data")
        assert event.data == (stored if isinstance(stored, dict) else {}), row["data_json"]
        payload = payload_of(event)
        if repr(payload) != row["payload"] or repr(type(payload).of(event)) != row["payload"]:
            differ.append(f"{row['kind']} {row['data_json']}: {payload!r}, was {row['payload']}")
    assert not differ, "\n".join(differ[:20])


def test_every_event_kind_has_a_payload_registered_or_explicitly_none() -> None:
    assert not NO_PAYLOAD & REGISTRY.keys()
    assert set(EventKind) == REGISTRY.keys() | NO_PAYLOAD
    for kind, payload in REGISTRY.items():
        assert payload_of(kind, {}) == payload.from_json({})  # the empty row reads, as a value of its type
    assert REGISTRY[EventKind.PROGRESS] is ProbeFields and REGISTRY[EventKind.ACTION] is ActionData


def test_the_typed_view_of_an_event_is_its_kinds_payload() -> None:
    event = Event(job="j", attempt=1, kind=EventKind.STACKS, message="m",
                  data={"note": "no py-spy", "processes": "not a list", "left_out": True})
    assert payload_of(event) == StacksData.of(event) == StacksData("no py-spy", ())
    for data in ([1, 2], "text", None, 3):  # no mapping at all: no error, a payload of nothing said
        assert payload_of(EventKind.ACTION, data) == ActionData()
        assert payload_of(EventKind.PROGRESS, data) == ProbeFields({})


def test_a_payload_whose_field_has_no_derived_reading_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TypeError, match=r"Odd\.when: no lenient reading of .*; give it Read\(fn\)"):
        @carried_by()
        @dataclass(frozen=True, slots=True)
        class Odd(StoredPayload):
            when: set[int]

    with pytest.raises(TypeError, match=r"Sure\.state: a .*JobState.* may read as absent; declare it `\| None`"):
        @carried_by()
        @dataclass(frozen=True, slots=True)
        class Sure(StoredPayload):
            state: JobState

    @carried_by()
    @dataclass(frozen=True, slots=True)
    class Given(StoredPayload):
        when: Annotated[set[int], Read(lambda v: set(v) if isinstance(v, list) else set())] = field(
            default_factory=set)

    assert Given.from_json({"when": [1, 1]}) == Given({1}) and Given.from_json({"when": 3}) == Given(set())
    with pytest.raises(TypeError, match="already carry"):
        carried_by(EventKind.ACTION)(Given)


def test_a_damaged_row_is_shown_with_no_data_and_the_rest_of_the_job_still_reads(daemon: DaemonProcess,
                                                                                   daemon_env: dict[str, str]) -> None:
    store = Store(daemon.paths.db)
    store.upsert_job("worn", {"name": "worn", "command": ["true"]}, JobState.DONE)
    store.record_events([Event(job="worn", attempt=1, kind=kind, message=kind.value) for kind in
                         (EventKind.LAUNCHED, EventKind.FAILURE, EventKind.ACTION, EventKind.EXITED)])
    store.close()
    with sqlite3.connect(daemon.paths.db) as db:  # as a hand edit or a damaged disk may leave them
        for kind, text in (("launched", "not json"), ("failure", "null"), ("action", "[1, 2]")):
            db.execute("UPDATE events SET data_json=? WHERE job='worn' AND kind=?", (text, kind))
    db.close()
    shown = supervise(daemon_env, "events", "worn", "--json", check=False)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["kind"], r["data"]) for r in rows] == [("launched", {}), ("failure", {}), ("action", {}), ("exited", {})]
    assert daemon.client().ping().pid > 0


def test_inside_the_process_an_events_data_is_read_through_its_payload_never_by_key() -> None:
    """``Event.data`` is the payload's JSON, met only where events are stored and sent: a module
    that reads it by key (``.data["x"]``, ``.data.get("x")``) reads it through its kind's payload."""
    package = Path(__file__).resolve().parents[1] / "supervisor"
    by_key = re.compile(r"\.data(\[|\.get\(|\.pop\()")
    found = [f"{path.relative_to(package.parent)}:{n}: {line.strip()}"
             for path in sorted(package.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if by_key.search(line)]
    assert not found, "read these through the kind's payload (core/payloads.py):\n" + "\n".join(found)
