"""The migration that thins a store's progress rows to each bar's milestones, run on a store
built at the version before it, as an upgraded daemon opens it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from supervisor.store.database import Store
from supervisor.store.schema import MIGRATIONS

# The thinning migration's index: later migrations are appended after it.
THINNING = next(i for i, m in enumerate(MIGRATIONS) if "DELETE FROM events WHERE id IN" in m)


def _old_store(path: Path) -> sqlite3.Connection:
    """A store at the version before the thinning migration (every earlier migration applied)."""
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:THINNING]:
        db.executescript(migration)
    db.execute(f"PRAGMA user_version={THINNING}")
    db.execute("INSERT INTO jobs(name, spec_json, state, created, updated) VALUES('j', '{}', 'done', 0, 0)")
    return db


def _event(db: sqlite3.Connection, attempt: int, ts: float, kind: str, offset: int, data: object,
           probe: str = "tqdm.bar") -> None:
    db.execute("INSERT INTO events(job, attempt, ts, kind, probe, log_offset, message, data_json) "
               "VALUES('j', ?, ?, ?, ?, ?, 'm', ?)", (attempt, ts, kind, probe, offset,
                                                      data if isinstance(data, str) else json.dumps(data)))


def test_old_progress_rows_are_thinned_to_milestones(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    db = _old_store(path)
    _event(db, 1, 0.0, "phase", 0, {})
    for i in range(20_001):  # one bar with a total, each step a row, as stored before
        _event(db, 1, 1.0 + i * 0.001, "progress", 10 + i, {"done": i, "total": 20_000, "desc": "train"})
    for i in range(301):  # a bar without a total, a step a second for 300 s, in another attempt
        _event(db, 2, 60.0 + i, "progress", 10 + i, {"done": i})
    for rank in (0, 1):  # two ranks' bars of 1,000 steps, interleaved
        for i in range(1001):
            _event(db, 3, 1.0, "progress", 10 + 2 * i + rank, {"done": i, "total": 1000, "rank": rank})
    _event(db, 4, 2.0, "progress", 99_999, "not json")  # not read by the migration, and left alone
    _event(db, 3, 2.0, "metric", 99_998, {"loss": 1.0})
    db.commit()
    db.close()

    store = Store(path)
    try:
        train = [e.data["done"] for e in store.events("j", attempt=1, kinds=["progress"], limit=100_000)]
        assert train[0] == 0 and train[-1] == 20_000 and len(train) == 101, len(train)
        assert train[1:4] == [200, 400, 600]
        untotalled = [e.data["done"] for e in store.events("j", attempt=2, kinds=["progress"])]
        assert untotalled[0] == 0 and untotalled[-1] == 300 and 10 <= len(untotalled) <= 12, untotalled
        ranks = [e for e in store.events("j", attempt=3, kinds=["progress"], limit=100_000) if "rank" in e.data]
        assert len(ranks) == 2 * 101
        assert {e.data["rank"] for e in ranks if e.data["done"] == 1000} == {0, 1}
        assert len(store.events("j", attempt=3, kinds=["metric"])) == 1
        assert len(store.events("j", attempt=1, kinds=["phase"])) == 1
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM events WHERE attempt = 4").fetchone()[0] == 1
