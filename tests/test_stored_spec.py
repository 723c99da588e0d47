"""A job's stored spec, parsed into a ``JobSpec`` once as its row is read: a spec that no longer
validates (stored by another version, a field since removed) is a state of the row that the
views show, never a crash of a reader, a verb or the daemon."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import DaemonProcess
from e2e_jobs import supervise

from supervisor.core.config import Paths
from supervisor.core.events import JobState
from supervisor.jobs.views import job_status
from supervisor.spec.model import JobSpec
from supervisor.store.database import Store


def _spec(name: str, **more: object) -> dict[str, object]:
    return JobSpec.model_validate({"name": name, "command": ["true"], **more}).model_dump(mode="json")


def _unreadable(path: Path, name: str) -> None:
    """The job's stored spec as a later version might leave it: a field this one does not know."""
    db = sqlite3.connect(path)
    stored = {**_spec(name, host="local", shards=1), "checkpoint_every": "1h"}
    db.execute("UPDATE jobs SET spec_json=? WHERE name=?", (json.dumps(stored), name))
    db.commit()
    db.close()


def test_the_spec_is_parsed_once_for_each_spec_stored(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", _spec("j", after=["a"]), JobState.STARTING)
    first = store.job("j")
    assert isinstance(first.spec, JobSpec) and first.spec_error is None
    assert (first.spec.after, first.after, first.host, first.shards, first.max_attempts) == (["a"], ["a"], "local", 1, 3)
    assert store.job("j").spec is first.spec and store.jobs()[0].spec is first.spec  # not parsed again
    store.upsert_job("j", _spec("j", restart={"max_attempts": 5}), JobState.STARTING)
    again = store.job("j")
    assert again.spec is not first.spec and again.max_attempts == 5 and again.after == []
    assert again.stored == _spec("j", restart={"max_attempts": 5})  # as stored: what a change is measured against


def test_a_spec_that_no_longer_validates_is_a_state_of_its_row(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("old", _spec("old"), JobState.FAILED, "gave up")
    store.upsert_job("ok", _spec("ok"), JobState.DONE)
    _unreadable(tmp_path / "s.db", "old")
    row = store.job("old")
    assert row.spec is None and row.spec_error is not None and "checkpoint_every" in row.spec_error
    assert "\n" not in row.spec_error
    assert (row.host, row.shards, row.after, row.max_attempts) == ("local", 1, [], 3)  # as it stored them
    assert [r.name for r in store.jobs()] == ["ok", "old"] and store.job("ok").spec is not None
    status = job_status(row, store, None)
    assert status.spec_error == row.spec_error and status.state is JobState.FAILED and status.outputs == []
    assert job_status(store.job("ok"), store, None).spec_error is None


def test_status_and_stop_of_a_job_whose_spec_no_longer_validates(home: Path, daemon_env: dict[str, str], monkeypatch) -> None:
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    paths = Paths(home)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(paths.db)
    store.upsert_job("old", _spec("old"), JobState.FAILED, "gave up")
    store.close()
    _unreadable(paths.db, "old")
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        shown = supervise(daemon_env, "status", "old", check=False)
        assert "spec no longer validates: unknown field 'checkpoint_every'" in shown.stdout, shown
        stopped = supervise(daemon_env, "stop", "old", check=False)
        assert stopped.returncode == 65, stopped
        said = stopped.stderr.strip().splitlines()
        assert len(said) == 1 and "its stored spec no longer validates" in said[0] and "supervise start" in said[0]
        restarted = supervise(daemon_env, "restart", "old", check=False)
        assert restarted.returncode == 65 and "no longer validates" in restarted.stderr, restarted
        assert daemon.client().status("old").jobs[0].state == "failed"  # the daemon is alive; nothing stored lost
    finally:
        daemon.close()
