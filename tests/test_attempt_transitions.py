"""An attempt's writes as typed values: ``AttemptUpdate`` for a live row, ``AttemptEnd`` for its end,
stored with the events that tell it in one transaction by the recorder, once; and the one writer
of ends and job states, held by reading every module's source."""

from __future__ import annotations

import ast
import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from supervisor.core.actions import ActionKind, AttemptAction
from supervisor.core.bus import EventBus
from supervisor.core.errors import StoreBusy, TransitionRefused
from supervisor.core.events import AttemptState, Event, EventKind, Failure, FailureKind, JobState, Phase, Verdict
from supervisor.core.progress import BarProgress
from supervisor.hosts.base import LaunchRequest
from supervisor.hosts.local.cgroup import Containment, ContainmentKind
from supervisor.hosts.local.host import LocalHost
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.strays import StrayStop, stop_strays
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import KEEP, AttemptEnd, AttemptUpdate, ExitCode
from supervisor.store.database import AttemptRow, Store

SUPERVISOR = Path(__file__).resolve().parents[1] / "supervisor"


def _row(n: int = 1) -> AttemptRow:
    return AttemptRow(job="j", n=n, tag=f"j.{n}", host="local", argv=["a"], workdir="/", log_path="/l",
                      status_path="/s", pid=None, pgid=None, start_time=None, started=1.0, ended=None,
                      state=AttemptState.LAUNCHING, exit_code=None, exit_signal=None, log_offset=0, phase=None,
                      progress=None, verdict=None, reason=None, failure=None, fingerprint=None, action=None)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    made = Store(tmp_path / "s.db")
    made.upsert_job("j", {"name": "j", "command": ["a"]}, JobState.RUNNING)
    made.add_attempt(_row())
    return made


def _action(message: str) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.ACTION, message=message)


def test_an_update_writes_the_fields_it_gives_and_keeps_the_rest(store: Store) -> None:
    oom = Failure(FailureKind.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory.", "fp", None, "ERROR")
    bar = BarProgress("p.bar", 3, 8, 0.5, 2.5, "Loading")
    store.attempt_running("j", 1, AttemptUpdate(pid=42, pgid=42, start_time=5.0, scheduler_id=None))
    store.update_attempt("j", 1, AttemptUpdate(log_offset=100, phase=Phase.RUNNING, progress=bar, failure=oom,
                                               fingerprint="fp", verdict=Verdict.STALLED, reason="no progress"))
    store.update_attempt("j", 1, AttemptUpdate(exit_code=0))
    row = store.attempt("j", 1)
    assert (row.state, row.pid, row.pgid, row.start_time, row.log_offset, row.phase) == \
        (AttemptState.RUNNING, 42, 42, 5.0, 100, Phase.RUNNING)
    assert (row.progress, row.failure, row.fingerprint, row.exit_code) == (bar, oom, "fp", 0)
    assert (row.verdict, row.reason) == (Verdict.STALLED, "no progress")
    store.update_attempt("j", 1, AttemptUpdate(verdict=None, reason=None, phase=None))  # None clears; KEEP keeps
    row = store.attempt("j", 1)
    assert (row.verdict, row.reason, row.phase, row.log_offset, row.pid) == (None, None, None, 100, 42)
    store.update_attempt("j", 1, AttemptUpdate())  # nothing given: nothing written
    store.update_attempt("j", 1, AttemptUpdate(pid=KEEP))
    assert store.attempt("j", 1) == row


def test_an_end_is_stored_with_its_events_and_published(store: Store) -> None:
    bus = EventBus()
    seen: list[Event] = []
    bus.subscribe(seen.extend)
    before = time.time()
    end = AttemptEnd(state=AttemptState.ENDED, verdict=Verdict.CRASHED, action=AttemptAction.relaunch(4.0),
                     exit=ExitCode(1, None), reason="exited 1")
    Recorder(store, bus).attempt_ended("j", 1, end, _action("relaunch in 4.0s"))
    row = store.attempt("j", 1)
    assert (row.state, row.verdict, row.reason, row.exit_code, row.exit_signal) == \
        (AttemptState.ENDED, Verdict.CRASHED, "exited 1", 1, None)
    assert (row.action, row.action_kind) == ("relaunch in 4.0s", ActionKind.RELAUNCH)
    assert row.ended is not None and before <= row.ended <= time.time()  # stamped by the store: no time was given
    stored = store.events("j", kinds=["action"])
    assert [e.message for e in stored] == ["relaunch in 4.0s"]
    assert [(e.id, e.message) for e in seen] == [(stored[0].id, "relaunch in 4.0s")]


def test_an_end_with_no_exit_known_keeps_the_stored_exit(store: Store) -> None:
    store.update_attempt("j", 1, AttemptUpdate(exit_code=None, exit_signal=9))
    store.end_attempt(AttemptEnd(state=AttemptState.STOPPED, action=AttemptAction.stopped(), reason="stopped by user",
                                 at=12.5), [], job="j", n=1)
    row = store.attempt("j", 1)
    assert (row.state, row.exit_signal, row.ended, row.verdict, row.action_kind) == \
        (AttemptState.STOPPED, 9, 12.5, None, ActionKind.STOP)


def test_an_end_and_its_event_are_one_transaction(store: Store, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock: refused whole
    end = AttemptEnd(state=AttemptState.ENDED, verdict=Verdict.DONE, action=AttemptAction.none("job done"), reason="ok")
    with pytest.raises(StoreBusy):
        store.end_attempt(end, [_action("none: job done")], job="j", n=1)
    other.execute("ROLLBACK")
    assert store.attempt("j", 1).state is AttemptState.LAUNCHING and store.events("j") == []
    store.end_attempt(end, [_action("none: job done")], job="j", n=1)  # tried again: both, once
    assert store.attempt("j", 1).state is AttemptState.ENDED and len(store.events("j")) == 1


@pytest.mark.parametrize("final", [AttemptState.ENDED, AttemptState.STOPPED])
def test_an_attempt_ends_once(store: Store, final: AttemptState) -> None:
    store.end_attempt(AttemptEnd(state=final, reason="first", at=1.0, exit=ExitCode(0, None)), [], job="j", n=1)
    again = AttemptEnd(state=AttemptState.STOPPED, action=AttemptAction.stopped(), reason="second")
    with pytest.raises(TransitionRefused, match=f"attempt 1 of job 'j' is {final.value} already"):
        store.end_attempt(again, [_action("stopped by user")], job="j", n=1)
    with pytest.raises(TransitionRefused, match="cannot become running"):
        store.attempt_running("j", 1, AttemptUpdate(pid=7))
    row = store.attempt("j", 1)
    assert (row.state, row.reason, row.ended, row.pid, row.action) == (final, "first", 1.0, None, None)
    assert store.events("j") == []  # the refused end's event was not stored either


def test_a_lost_attempt_may_still_be_ended(store: Store) -> None:
    """Lost is the daemon not knowing how it ended: a later look (a stop that finds it alive) may tell."""
    store.end_attempt(AttemptEnd(state=AttemptState.LOST, reason="spec unreadable on recovery"), [], job="j", n=1)
    store.end_attempt(AttemptEnd(state=AttemptState.STOPPED, action=AttemptAction.stopped(), reason="stopped"),
                      [_action("stopped by user")], job="j", n=1)
    assert store.attempt("j", 1).state is AttemptState.STOPPED


def test_an_end_is_never_an_active_state() -> None:
    for state in (AttemptState.LAUNCHING, AttemptState.RUNNING):
        with pytest.raises(ValueError, match="does not end"):
            AttemptEnd(state=state, reason="x")


def test_the_job_state_goes_through_the_recorder_only(store: Store) -> None:
    assert not hasattr(store, "set_job_state")
    Recorder(store, EventBus()).job_state("j", JobState.FAILED, "why")
    assert (store.job("j").state, store.job("j").reason) == (JobState.FAILED, "why")
    assert [e.message for e in store.events("j", kinds=["state"])] == ["failed: why"]


# ---- the one writer --------------------------------------------------------------------------

# Calls only the recorder makes: an attempt's end, a job's state (record_events with job_state=).
_RECORDER = "jobs/recorder.py"
_STORE = ("store/database.py", "store/schema.py")  # the store, and its migrations


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _called(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def test_only_the_recorder_ends_an_attempt_or_sets_a_job_state() -> None:
    found = []
    for path in sorted(SUPERVISOR.rglob("*.py")):
        where = str(path.relative_to(SUPERVISOR))
        source = path.read_text()
        for call in _calls(ast.parse(source)):
            name = _called(call)
            sets_state = name == "record_events" and any(k.arg == "job_state" for k in call.keywords)
            if (name == "end_attempt" or sets_state) and where != _RECORDER:
                found.append(f"{where}:{call.lineno} {name}")
            if name in ("update_attempt", "set_job_state") and any(k.arg is None for k in call.keywords):
                found.append(f"{where}:{call.lineno} {name}(**...)")  # column names passed as keywords
        if where not in _STORE and any(sql in source for sql in ("UPDATE attempts SET", "UPDATE jobs SET")):
            found.append(f"{where}: writes the attempts' or jobs' rows in SQL")
    assert not found, found


def test_the_runner_stores_each_end_through_the_recorder() -> None:
    """The runner's and the stray stop's ends reach the recorder (a source check: their callers'
    paths need a host, covered end to end by test_daemon_e2e and test_outside_kills_e2e)."""
    for module in ("jobs/strays.py", "jobs/recovery.py", "jobs/runner/_journal.py"):
        names = {_called(call) for call in _calls(ast.parse((SUPERVISOR / module).read_text()))}
        assert "attempt_ended" in names, module


# ---- the stray stop: a real process no runner watches --------------------------------------------

def _stray(tmp_path: Path, store: Store, recorder: Recorder, *, ended_first: bool) -> tuple[AttemptRow, StrayStop]:
    """Launch a real process as attempt 1 of ``j`` (its row says so), no runner watching it, and stop
    it as `supervise stop` does; ``ended_first``: its end stored before (a survivor of its kill)."""
    host = LocalHost(tmp_path / "logs", containment=Containment(ContainmentKind.TAG, "tag only"))

    async def run() -> StrayStop:
        request = LaunchRequest(argv=["/bin/sh", "-c", "exec sleep 60"], workdir=str(tmp_path), env={},
                                log_path=str(tmp_path / "logs" / "j.1.log"),
                                status_path=str(tmp_path / "logs" / "j.1.exit"), tag="j.1")
        handle = await host.launch(request)
        store.attempt_running("j", 1, AttemptUpdate(pid=handle.pid, pgid=handle.pgid, start_time=handle.start_time))
        if ended_first:
            store.end_attempt(AttemptEnd(state=AttemptState.ENDED, verdict=Verdict.STALLED, reason="stalled",
                                         action=AttemptAction.give_up("stalled")), [], job="j", n=1)
        return await stop_strays(recorder, host, JobSpec(name="j", command=["sleep", "30"]), None, grace_s=2.0)

    stopped = asyncio.run(run())
    return store.attempt("j", 1), stopped


def test_the_stray_stop_stores_its_end_with_its_event(store: Store, tmp_path: Path) -> None:
    seen: list[Event] = []
    bus = EventBus()
    bus.subscribe(seen.extend)
    row, stopped = _stray(tmp_path, store, Recorder(store, bus), ended_first=False)
    assert stopped.attempts == [1]
    assert (row.state, row.action_kind, row.reason) == \
        (AttemptState.STOPPED, ActionKind.STOP, "stopped by user; it was running unwatched")
    told = store.events("j", kinds=["action"])
    assert len(told) == 1 and told[0].message.startswith("stopped by user (it was running unwatched)")
    assert [e.id for e in seen] == [told[0].id]


def test_the_stray_stop_of_an_attempt_already_ended_tells_it_and_keeps_its_end(store: Store, tmp_path: Path) -> None:
    row, stopped = _stray(tmp_path, store, Recorder(store, EventBus()), ended_first=True)
    assert stopped.attempts == [1]
    assert (row.state, row.verdict, row.action_kind) == (AttemptState.ENDED, Verdict.STALLED, ActionKind.GIVE_UP)
    assert [e.message.split(":")[0] for e in store.events("j", kinds=["action"])] == \
        ["stopped by user (it was running unwatched)"]
