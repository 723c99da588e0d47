"""What was done when an attempt ended: an ActionKind inside the stored sentence, read the same
from rows any version wrote."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.core.actions import ActionKind, AttemptAction
from supervisor.core.events import AttemptState, JobState
from supervisor.jobs.shard_views import shard_rows
from supervisor.store.attempt_writes import AttemptEnd
from supervisor.store.database import AttemptRow, Store
from supervisor.store.schema import MIGRATIONS


def _row(n: int, shard: int | None = None) -> AttemptRow:
    return AttemptRow(job="j", n=n, tag=f"j.{n}", host="local", argv=["a"], workdir="/", log_path="/l",
                      status_path="/s", pid=None, pgid=None, start_time=None, started=1.0, ended=None,
                      state=AttemptState.RUNNING, exit_code=None, exit_signal=None, log_offset=0, phase=None,
                      progress=None, verdict=None, reason=None, failure=None, fingerprint=None, action=None,
                      shard=shard)


def _as_before_the_kind_column(db: sqlite3.Connection) -> None:
    """The store as the version before ``action_kind``'s values leaves it (they are filled by one
    migration, which the next open runs again over these rows, then the later ones, each of which may
    run again over its own result)."""
    filling = next(i for i, m in enumerate(MIGRATIONS) if "UPDATE attempts SET action_kind" in m)
    db.execute("UPDATE attempts SET action_kind = NULL")
    db.execute(f"PRAGMA user_version={filling}")
    db.commit()


def test_the_sentences_stored_are_those_stored_before() -> None:
    assert AttemptAction.relaunch(4.0) == AttemptAction(ActionKind.RELAUNCH, "relaunch in 4.0s")
    assert AttemptAction.give_up("launch failed") == AttemptAction(ActionKind.GIVE_UP, "give up: launch failed")
    assert AttemptAction.stopped() == AttemptAction(ActionKind.STOP, "stopped by user")
    assert AttemptAction.none("job done") == AttemptAction(ActionKind.NONE, "none: job done")
    for action in (AttemptAction.relaunch(0.0), AttemptAction.give_up("x"), AttemptAction.stopped(),
                   AttemptAction.none("supervision failed")):
        assert AttemptAction.read(action.text) == action


# Sentences as stores hold them (each version's), and what they were meant as.
OLD_ROWS = [
    ("relaunch in 1.0s", ActionKind.RELAUNCH),
    ("relaunch in 0.0s", ActionKind.RELAUNCH),  # a preempted attempt's
    ("relaunch", ActionKind.RELAUNCH),
    ("give up: same failure twice in a row (fingerprint abc): a deterministic bug, not relaunching", ActionKind.GIVE_UP),
    ("give up: GPU memory leaked", ActionKind.GIVE_UP),
    ("stopped by user", ActionKind.STOP),
    ("none: job done", ActionKind.NONE),
    ("none: supervision failed", ActionKind.NONE),
    ("requeued by a version from the future", ActionKind.NONE),
    ("", ActionKind.NONE),
]


def test_old_rows_read_as_the_kind_their_sentence_begins_with(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, JobState.RUNNING)
    for n in range(1, len(OLD_ROWS) + 2):
        store.add_attempt(_row(n))
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")  # written as text, the way every version before the kind's column has
    db.executemany("UPDATE attempts SET action=?, state='ended', ended=2 WHERE job='j' AND n=?",
                   [(text, n) for n, (text, _) in enumerate(OLD_ROWS, 1)])
    _as_before_the_kind_column(db)
    db.close()
    rows = Store(tmp_path / "s.db").attempts("j")
    assert [r.action for r in rows] == [text for text, _ in OLD_ROWS] + [None]  # the API shows the sentence
    assert [r.action_kind for r in rows] == [kind for _, kind in OLD_ROWS] + [None]  # None: not ended yet


def test_the_store_writes_an_action_as_its_sentence(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, JobState.RUNNING)
    store.add_attempt(_row(1))
    store.end_attempt(AttemptEnd(state=AttemptState.ENDED, action=AttemptAction.give_up("launch failed"), reason="x"),
                      [], job="j", n=1)
    row = store.attempt("j", 1)
    assert (row.action, row.action_kind) == ("give up: launch failed", ActionKind.GIVE_UP)


@pytest.mark.parametrize(("job_state", "relaunching"), [(JobState.RUNNING, JobState.BACKOFF),
                                                         (JobState.FAILED, JobState.STOPPED)])
def test_a_shard_whose_old_row_says_relaunch_is_in_backoff(tmp_path: Path, job_state: JobState,
                                                           relaunching: JobState) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, JobState.RUNNING)
    for n, shard in ((1, 0), (2, 1), (3, 2)):
        store.add_attempt(_row(n, shard))
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")
    db.executemany("UPDATE attempts SET action=?, state=?, ended=2 WHERE job='j' AND n=?",
                   [("relaunch in 2.0s", "ended", 1), ("give up: attempt 3/3 failed", "ended", 2),
                    ("stopped by user", "stopped", 3)])
    _as_before_the_kind_column(db)
    db.close()
    attempts = Store(tmp_path / "s.db").attempts("j")
    assert [s.state for s in shard_rows(3, job_state, attempts)] == [relaunching, JobState.FAILED, JobState.STOPPED]
    assert replace(attempts[0], action="relaunch in 9.0s").action_kind is ActionKind.RELAUNCH
