"""Event payloads: one typed value per event kind, stored in the JSON shape stores have always had,
and read back leniently from rows any earlier version wrote."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.events import AttemptState, Event, EventKind, JobState, Phase, Verdict
from supervisor.core.payloads import (
    ActionData,
    AlertData,
    ExitedData,
    GpuFaultData,
    GpuHolder,
    GpuWaitData,
    LaunchedData,
    ProbeFields,
    ProcessStackData,
    RestartData,
    SlowStep,
    StacksData,
    StateData,
    UntypedData,
    VerdictData,
    payload_of,
)
from supervisor.core.progress import BarProgress, Progress
from supervisor.jobs.milestones import ProgressMilestones
from supervisor.spec.model import HealthSpec
from supervisor.store.attempt_writes import AttemptUpdate
from supervisor.store.database import AttemptRow, Store
from supervisor.watchdog import Watchdog

# Rows as stores hold them today (what each producer wrote before payloads were typed), with keys
# an older or newer version may lack or add, and values this version does not know.
STORED: list[tuple[EventKind, dict[str, Any]]] = [
    (EventKind.PROGRESS, {"done": 3, "total": 8, "unit": "shards", "rate": 1.5, "desc": "Loading", "rank": 1}),
    (EventKind.PROGRESS, {"done": "7", "total": "not a number"}),
    (EventKind.PROGRESS, {"eta": "1s"}),
    (EventKind.PHASE, {}),
    (EventKind.INFO, {"heartbeat": True}),
    (EventKind.METRIC, {"gen_tps": 12.5, "phase": "no_such_phase"}),
    (EventKind.FAILURE, {"exc_type": "RuntimeError", "failure": "runtime_error", "fingerprint": "f", "traceback": None}),
    (EventKind.LAUNCHED, {"pid": 12, "argv": ["python", "x.py"], "log": "/l", "host": "local", "scheduler_id": None}),
    (EventKind.LAUNCHED, {"pid": 12}),  # written before argv/log/host were stored
    (EventKind.EXITED, {"returncode": 1, "signal": None}),
    (EventKind.EXITED, {"returncode": "1", "core": True}),
    (EventKind.VERDICT, {"verdict": "stalled", "bound_s": 60.0, "bound_source": "default floor"}),
    (EventKind.VERDICT, {"verdict": "a_verdict_from_the_future", "also": []}),
    (EventKind.VERDICT, {}),
    (EventKind.ACTION, {}),
    (EventKind.ACTION, {"held": True}),
    (EventKind.ACTION, {"terminated": [[1, "python"]], "killed": [], "survivors": [], "reparented": []}),
    (EventKind.ACTION, {"slow": True, "probe": "p", "bar": "b", "done": 4, "total": 8, "step_s": 9.0}),
    (EventKind.ACTION, {"woken_by": "gpu_sample", "sample_ts": 1.0, "waited_s": 2.0, "extra": {"x": 1}}),
    (EventKind.ALERT, {"kind": "crash", "severity": "error", "evidence": "e", "next": "relaunch"}),
    (EventKind.ALERT, {"pack": "slowpack", "reason": "over budget"}),
    (EventKind.DAEMON_RESTARTED, {"down_s": 3.5, "down_since": 10.0, "pid": 4}),
    (EventKind.GPU_WAIT, {"holders": [{"pid": 1, "gpu": 0, "used_mib": 100, "command": "sleep"}, "junk"]}),
    (EventKind.GPU_WAIT, {"holders": "not a list"}),
    (EventKind.GPU_FAULT, {"gpu": 0, "kind": "xid", "xid": 79, "detail": "fell off the bus"}),
    (EventKind.STACKS, {"note": "", "processes": [{"pid": 1, "name": "python", "stack": "Thread 1", "error": None}]}),
    (EventKind.STACKS, {}),
    (EventKind.STATE, {"state": "running", "reason": "attempt 1"}),
    (EventKind.STATE, {"state": "a_state_from_the_future"}),
    (EventKind.GPU, {"anything": 1}),
]


def test_every_event_kind_has_a_payload_type() -> None:
    for kind in EventKind:
        assert payload_of(kind, {}) is not None


def test_rows_in_todays_stored_shape_read_back_typed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.record_events([Event(job="j", attempt=1, kind=kind, message=kind.value, data=data) for kind, data in STORED])
    read = store.events("j", limit=1000)
    assert len(read) == len(STORED)
    for event, (_, data) in zip(read, STORED, strict=True):
        payload_of(event.kind, event.data)  # never an error, whatever the row holds
        if event.kind is not EventKind.FAILURE:
            assert event.data == data  # what the API and `events --json` show: the row as stored
    progress = [ProbeFields.of(e).progress for e in read if e.kind is EventKind.PROGRESS]
    assert progress == [Progress(3, 8, "shards", 1.5, "Loading"), Progress(7), None]
    assert [ProbeFields.of(e).heartbeat for e in read if e.kind is EventKind.INFO] == [True]
    assert [ProbeFields.of(e).phase for e in read if e.kind is EventKind.METRIC] == [None]
    assert [LaunchedData.of(e) for e in read if e.kind is EventKind.LAUNCHED] == [
        LaunchedData(12, ["python", "x.py"], "/l", "local"), LaunchedData(12, [], None, None)]
    assert [ExitedData.of(e) for e in read if e.kind is EventKind.EXITED] == [ExitedData(1, None), ExitedData(None, None)]
    verdicts = [VerdictData.of(e) for e in read if e.kind is EventKind.VERDICT]
    assert [v.verdict for v in verdicts] == [Verdict.STALLED, None, None]
    assert verdicts[0].evidence == {"bound_s": 60.0, "bound_source": "default floor"}
    actions = [ActionData.of(e) for e in read if e.kind is EventKind.ACTION]
    assert actions[0] == ActionData() and actions[1].held is True and actions[2].terminated == [[1, "python"]]
    slow = actions[3].slow
    assert slow is not None and (slow.bar, slow.done, slow.step_s, slow.stall_bound_s) == ("b", 4, 9.0, 0.0)
    assert (actions[4].woken_by, actions[4].waited_s) == ("gpu_sample", 2.0)
    assert [AlertData.of(e) for e in read if e.kind is EventKind.ALERT] == [
        AlertData("crash", "error", "e", "relaunch"), AlertData(pack="slowpack", reason="over budget")]
    assert [RestartData.of(e) for e in read if e.kind is EventKind.DAEMON_RESTARTED] == [RestartData(3.5, 10.0, 4)]
    assert [GpuWaitData.of(e) for e in read if e.kind is EventKind.GPU_WAIT] == [
        GpuWaitData((GpuHolder(1, 0, 100, "sleep"),)), GpuWaitData(())]
    assert [GpuFaultData.of(e).xid for e in read if e.kind is EventKind.GPU_FAULT] == [79]
    assert [StacksData.of(e) for e in read if e.kind is EventKind.STACKS] == [
        StacksData("", (ProcessStackData(1, "python", "Thread 1", None),)), StacksData("", ())]
    assert [StateData.of(e) for e in read if e.kind is EventKind.STATE] == [
        StateData(JobState.RUNNING, "attempt 1"), StateData(None, "")]


# What each producer stored before its payload was typed, and the payload it builds now: the
# JSON must be the same, key order included (rows, the API and `events --json` are compared as text).
WRITTEN: list[tuple[Any, dict[str, Any]]] = [
    (LaunchedData(7, ["a", "b"], "/l", "local", None),
     {"pid": 7, "argv": ["a", "b"], "log": "/l", "host": "local", "scheduler_id": None}),
    (ExitedData(None, 9), {"returncode": None, "signal": 9}),
    (VerdictData(Verdict.STALLED, {"probe": "p", "done": 3, "also": ("x",)}),
     {"verdict": "stalled", "probe": "p", "done": 3, "also": ["x"]}),
    (ActionData(), {}),
    (ActionData(held=False), {"held": False}),
    (ActionData(reason="Resources"), {"reason": "Resources"}),
    (ActionData(down_s=1.5), {"down_s": 1.5}),
    (ActionData(error="OSError()"), {"error": "OSError()"}),
    (ActionData(events_per_attempt=100), {"events_per_attempt": 100}),
    (ActionData(terminated=[(1, "a")], killed=[], survivors=[], reparented=[1]),
     {"terminated": [[1, "a"]], "killed": [], "survivors": [], "reparented": [1]}),
    (ActionData(terminated=[1], killed=[2], survivors=[]), {"terminated": [1], "killed": [2], "survivors": []}),
    (ActionData(released=True, waited_s=0.5), {"released": True, "waited_s": 0.5}),
    (ActionData(woken_by="gpu_sample", sample_ts=3.0, waited_s=0.5),
     {"woken_by": "gpu_sample", "sample_ts": 3.0, "waited_s": 0.5}),
    (ActionData(slow=SlowStep("p", "b", 4, None, 9.0, 5.0, 2.0, 60.0, "history (1 run)", "running")),
     {"slow": True, "probe": "p", "bar": "b", "done": 4, "total": None, "step_s": 9.0, "slow_after_s": 5.0,
      "history_p95_s": 2.0, "stall_bound_s": 60.0, "bound_source": "history (1 run)", "phase": "running"}),
    (AlertData(kind="crash", severity="error", evidence="e", next="n"),
     {"kind": "crash", "severity": "error", "evidence": "e", "next": "n"}),
    (AlertData(pack="p", reason="r"), {"pack": "p", "reason": "r"}),
    (AlertData(evidence="e", next="not launched"), {"evidence": "e", "next": "not launched"}),
    (RestartData(2.0, 1.0, None), {"down_s": 2.0, "down_since": 1.0, "pid": None}),
    (GpuWaitData((GpuHolder(1, 0, 10, "sleep"),)),
     {"holders": [{"pid": 1, "gpu": 0, "used_mib": 10, "command": "sleep"}]}),
    (GpuFaultData(0, "xid", None, "d"), {"gpu": 0, "kind": "xid", "xid": None, "detail": "d"}),
    (StacksData("no py-spy", ()), {"note": "no py-spy", "processes": []}),
    (StacksData("", (), left_out=138), {"note": "", "processes": [], "left_out": 138}),
    (StateData(JobState.DONE, ""), {"state": "done", "reason": ""}),
    (ProbeFields({"done": 1, "x": "y"}), {"done": 1, "x": "y"}),
    (UntypedData({"a": 1}), {"a": 1}),
]


@pytest.mark.parametrize(("payload", "before"), WRITTEN)
def test_payloads_store_the_json_producers_stored_before(payload: Any, before: dict[str, Any]) -> None:
    assert json.dumps(payload.to_json()) == json.dumps(before)
    assert type(payload).from_json(json.loads(json.dumps(before))).to_json() == before  # and read back the same


def test_a_count_keeps_its_type_and_refuses_what_is_no_number() -> None:
    assert Progress.read({"done": 5, "total": 10}) == Progress(5, 10)  # an ETA alert says 5/10, not 5.0/10.0
    assert Progress.read({"done": " 12 ", "total": "1e3"}) == Progress(12, 1000.0)
    for bad in (True, None, "nan", float("nan"), "x", [1]):
        assert Progress.read({"done": bad}) is None
    assert Progress.read({"done": 3, "total": float("nan")}) == Progress(3)
    infinite = Progress.read({"done": "inf", "total": 64})
    assert infinite is not None and not infinite.finite and Progress(3, 64).finite
    assert Progress(5, 0).percent is None and Progress(5, 8).percent == 62 and Progress(9, 8).percent == 100
    assert Progress(5, float("inf")).percent is None


def test_the_store_keeps_a_line_whose_count_is_no_finite_number_as_it_came() -> None:
    sieve = ProgressMilestones()
    lines = [("inf", 64), (1, 64), (1, 64), (2, float("inf")), (3, float("inf")), (4, 64)]
    kept = [sieve.keep(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="m", probe="p.bar",
                             data={"done": done, "total": total}), 20.0 * t) for t, (done, total) in enumerate(lines)]
    # An infinite total is no total: the bar goes on, counted without one (one line per 30 s).
    assert kept == [True, True, False, True, False, True]


def test_a_progress_line_that_names_its_phase_enters_it() -> None:
    watchdog = Watchdog(HealthSpec(), clock=lambda: 0.0)
    watchdog.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="m", probe="p.bar",
                           data={"done": 1, "total": 4, "phase": Phase.WEIGHT_LOADING.value}))
    assert watchdog.phase is Phase.WEIGHT_LOADING


def test_an_attempts_stored_progress_reads_back_typed_whatever_its_shape(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {"name": "j"}, JobState.RUNNING)
    rows = [
        {"probe": "p.bar", "bar": "Loading", "done": 3, "total": 8, "rate_s_per_it": 0.5, "eta_s": 2.5},
        {"probe": "p.bar", "done": 3, "total": None, "rate_s_per_it": None, "eta_s": None, "later": "key"},
        {"probe": "p.bar", "done": "not a count"},
        {"done": 1},
        None,
    ]
    for n in range(1, len(rows) + 1):
        store.add_attempt(AttemptRow(job="j", n=n, tag=f"j.{n}", host="local", argv=["a"], workdir="/", log_path="/l",
                                     status_path="/s", pid=None, pgid=None, start_time=None, started=1.0, ended=None,
                                     state=AttemptState.RUNNING, exit_code=None, exit_signal=None, log_offset=0,
                                     phase=None, progress=None, verdict=None, reason=None, failure=None,
                                     fingerprint=None, action=None))
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")  # as earlier versions wrote it: JSON text
    db.executemany("UPDATE attempts SET progress_json=? WHERE job='j' AND n=?",
                   [(None if p is None else json.dumps(p), n) for n, p in enumerate(rows, 1)])
    db.commit()
    db.close()
    store = Store(tmp_path / "s.db")
    read = [a.progress for a in store.attempts("j")]
    assert read == [BarProgress("p.bar", 3, 8, 0.5, 2.5, "Loading"), BarProgress("p.bar", 3, None, None, None),
                    None, None, None]
    store.update_attempt("j", 5, AttemptUpdate(progress=read[0]))
    assert store.attempt("j", 5).progress == read[0]
    store.close()
    db = sqlite3.connect(tmp_path / "s.db")
    assert json.loads(db.execute("SELECT progress_json FROM attempts WHERE n=5").fetchone()[0]) == rows[0]  # the shape as before
    db.close()
