"""The gate between an unhealthy verdict and a kill: health.action, kill_after_s, hold/release."""

from __future__ import annotations

from supervisor.core.events import Verdict
from supervisor.jobs.runner._verdict import KillGate, Step
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Judgement

STALLED = Judgement(Verdict.STALLED, "shard 12/64, no progress for 2m00s")
HEALTHY = Judgement(Verdict.HEALTHY, "ok")


def gate(**health: object) -> KillGate:
    return KillGate.of(HealthSpec(**health))  # type: ignore[arg-type]


def test_kill_kills_at_once() -> None:
    assert gate().judge(STALLED, 0.0) is Step.KILL


def test_warn_never_kills() -> None:
    g = gate(action="warn")
    assert g.judge(STALLED, 0.0) is Step.WARN
    assert g.deadline() is None and g.judge(STALLED, 1e6) is Step.NOTHING
    assert g.next_action("j", 0.0) == 'nothing: health.action is "warn", it is never killed for this'
    assert g.judge(HEALTHY, 2e6) is Step.RECOVERED and g.judge(HEALTHY, 2e6) is Step.NOTHING


def test_warn_then_kill_counts_down_and_progress_cancels() -> None:
    g = gate(action="warn_then_kill", kill_after_s=120)
    assert g.judge(STALLED, 10.0) is Step.WARN
    assert g.next_action("j", 10.0) == "killing in 120 s unless it moves"
    assert g.judge(STALLED, 129.0) is Step.NOTHING and g.deadline() == 130.0
    assert g.judge(HEALTHY, 129.5) is Step.RECOVERED and g.deadline() is None
    assert g.judge(STALLED, 200.0) is Step.WARN  # a new episode: a new countdown
    assert g.judge(STALLED, 320.0) is Step.KILL


def test_hold_postpones_and_release_restarts_the_countdown() -> None:
    g = gate(action="warn_then_kill", kill_after_s=60)
    g.judge(STALLED, 0.0)
    g.hold()
    assert g.deadline() is None and g.judge(STALLED, 1000.0) is Step.NOTHING
    g.release(1000.0)
    assert g.deadline() == 1060.0 and g.judge(STALLED, 1059.0) is Step.NOTHING and g.judge(STALLED, 1060.0) is Step.KILL


def test_a_held_kill_action_warns_and_kills_once_released() -> None:
    g = KillGate.of(HealthSpec(), held=True)
    assert g.judge(STALLED, 5.0) is Step.WARN
    assert g.next_action("j", 5.0).startswith("nothing while held")
    g.release(50.0)
    assert g.judge(STALLED, 50.0) is Step.KILL
