"""A judgement's evidence is a typed value per rule inside the process (the kill gate, the alerts
and the slow report read its fields), and the dict stored with the verdict's event is made only
there (``to_json``), with the keys, values and order each rule has always stored."""

from __future__ import annotations

import json

from supervisor.core.events import Event, EventKind, Failure, FailureKind, Phase, Verdict
from supervisor.core.payloads import SlowStep, VerdictData
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import ExitNoted, Judgement, NoEvidence, Watchdog, slow_step
from supervisor.watchdog._evidence import Also, Exited, Stalled


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _bar(done: int) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="bar", probe="vllm.shards",
                 data={"done": done, "total": 64})


def _failure(line: str, fp: str) -> Event:
    tb = f"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n{line}"
    return Event(job="j", attempt=1, kind=EventKind.FAILURE, message=line, probe="python.traceback",
                 failure=Failure(FailureKind.RUNTIME_ERROR, line, fp, tb, None))


def _stalled() -> tuple[Watchdog, Judgement]:
    clock = Clock()
    w = Watchdog(HealthSpec(stall_floor_s=10, silence_s=30), clock=clock)
    w.observe(Event(job="j", attempt=1, kind=EventKind.PHASE, message="w", phase=Phase.WEIGHT_LOADING, probe="p"))
    for i in range(4):
        clock.t = 5.0 * i
        w.observe(_bar(i))
    clock.t = 15.0 + 40
    return w, w.check()


def test_a_stall_is_judged_with_typed_evidence_stored_as_it_always_was() -> None:
    _, j = _stalled()
    assert j.verdict is Verdict.STALLED
    assert isinstance(j.evidence, Also) and isinstance(j.evidence.first, Stalled)  # silent too: said as `also`
    stalled = j.evidence.first
    assert (stalled.probe, stalled.done, stalled.total, stalled.stalled_s) == ("vllm.shards", 3, 64, 40.0)
    stored = VerdictData(j.verdict, j.evidence.to_json()).to_json()
    assert list(stored) == ["verdict", "probe", "bar", "done", "total", "stalled_s", "median_interval_s", "bound_s",
                            "bound_source", "phase", "also"]
    assert stored["also"] == [j.evidence.also[0]] and "no output" in stored["also"][0]
    json.dumps(stored)  # what is stored is plain JSON


def test_an_exit_killed_for_a_verdict_keeps_its_figures_first_then_the_exits() -> None:
    w, stalled = _stalled()
    w.observe(_failure("RuntimeError: boom", "fp9"))
    j = w.exited(-9, None, killed_by_us=True)
    assert j.verdict is Verdict.STALLED and isinstance(j.evidence, Exited) and j.evidence.before == stalled.evidence
    noted = ExitNoted(ExitNoted(j.evidence, cpu_throttled_s=1.5), log_read_to=4096)
    data = noted.to_json()
    # The stall's figures in place (its `phase` too, with the exit's value, as a dict merge keeps it), then the exit's.
    assert list(data) == [*stalled.evidence.to_json(), "returncode", "signal", "signal_name", "progress", "failure",
                          "line", "fingerprint", "traceback_tail", "failures_seen", "cpu_throttled_s", "log_read_to"]
    assert data["signal_name"] == "SIGKILL" and data["fingerprint"] == "fp9" and data["failures_seen"] == 1
    assert data["cpu_throttled_s"] == 1.5 and data["log_read_to"] == 4096


def test_a_slow_step_is_read_as_itself_and_nothing_is_an_empty_dict() -> None:
    step = SlowStep("p", "bar", 3, 10, 9.0, 4.0, 3.0, 20.0, "history", "weight_loading")
    assert slow_step(step) is step
    assert Judgement(Verdict.LEAKED, "GPU memory leaked").evidence == NoEvidence()
    assert NoEvidence().to_json() == {}
