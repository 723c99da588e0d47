"""Events pruned with their attempts' logs: when retention deletes an old attempt's log, its
progress and metric events go too; its lifecycle events (launch, exit, verdict, action, failure,
alert) stay, and so does everything of the attempts whose logs are kept."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import PROGRESS_JOB, job_state
from test_store import attempt

from supervisor.core.events import AttemptState, Event, EventKind
from supervisor.store.database import Store
from supervisor.store.retention import Retention, prune_events, prune_logs

KINDS = [EventKind.LAUNCHED, EventKind.PHASE, EventKind.PROGRESS, EventKind.METRIC, EventKind.FAILURE,
         EventKind.EXITED, EventKind.VERDICT, EventKind.ACTION, EventKind.ALERT]


def _kinds(store: Store, n: int) -> list[str]:
    return sorted({e.kind.value for e in store.events("j", attempt=n)})


def test_an_attempts_progress_and_metrics_go_with_its_log(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {}, "running")
    rows = []
    for n in (1, 2, 3):
        log = tmp_path / f"{n}.log"
        log.write_text("x\n")
        row = replace(attempt(n=n), log_path=str(log), state=AttemptState.ENDED if n < 3 else AttemptState.RUNNING)
        store.add_attempt(row)
        rows.append(row)
        store.record_events([Event(job="j", attempt=n, kind=kind, message=kind.value, data={"done": 1})
                             for kind in KINDS for _ in range(3)])
    pruned = prune_logs(store.attempts("j"), Retention(keep_attempts=2, max_bytes=0))
    assert [(p.job, p.attempt) for p in pruned] == [("j", 1)]
    assert prune_events(store, pruned) == 6  # 3 progress, 3 metric
    every = sorted(k.value for k in KINDS)
    assert _kinds(store, 1) == sorted(set(every) - {"progress", "metric"})
    assert len(store.events("j", attempt=1)) == 3 * (len(KINDS) - 2)
    assert _kinds(store, 2) == every and _kinds(store, 3) == every
    assert prune_events(store, prune_logs(store.attempts("j"), Retention(2, 0))) == 0  # nothing more to go
    store.close()


def test_a_launch_prunes_the_old_attempts_progress_with_its_log(home: Path, daemon_env, make_job,
                                                                monkeypatch) -> None:
    (home / "config.toml").write_text("log_keep_attempts = 1\n")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        spec = make_job("bar", PROGRESS_JOB, params=', "10", "0.01"')
        first = client.start(str(spec), {})
        wait_until(lambda: job_state(client, "bar") == "done")
        kinds = {e.kind for e in client.events("bar", attempt=1).events}
        assert {"launched", "progress", "exited", "verdict"} <= kinds, kinds
        client.start(str(spec), {})
        wait_until(lambda: not Path(first.log_path).exists(), timeout=10)  # pruned at the launch
        wait_until(lambda: job_state(client, "bar") == "done")
        kept = {e.kind for e in client.events("bar", attempt=1).events}
        assert "progress" not in kept and {"launched", "exited", "verdict"} <= kept, kept
        assert "progress" in {e.kind for e in client.events("bar", attempt=2).events}
    finally:
        daemon.close()
