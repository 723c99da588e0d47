"""The watchdog's heartbeat (sd_notify WATCHDOG=1) and straggler rules, on an injected clock."""

from __future__ import annotations

from typing import Any

from supervisor.core.events import Event, EventKind, Phase, Verdict
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog


def step(w: Watchdog, rank: int, done: int, at: float, total: int = 100) -> None:
    w.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="step", probe="train.steps",
                    data={"done": done, "total": total, "rank": rank}), at)


def make(**health: Any) -> Watchdog:
    return Watchdog(HealthSpec(**health), clock=lambda: 0.0, started_at=0.0)


def test_no_ping_counts_from_the_start_then_from_the_last_ping() -> None:
    w = make(watchdog_s=10)
    assert w.check(9.9).verdict is Verdict.HEALTHY and w.next_check_at(9.9) == 10
    judged = w.check(10)
    assert judged.verdict is Verdict.SILENT and "none since its start" in judged.reason
    w = make(watchdog_s=10)
    w.pinged(8)
    assert w.check(17.9).verdict is Verdict.HEALTHY
    judged = w.check(18)
    assert judged.verdict is Verdict.SILENT and "since its last" in judged.reason
    assert judged.evidence.to_json()["watchdog_s"] == 10 and judged.evidence.to_json()["ever_pinged"] is True


def test_output_does_not_stand_in_for_pings() -> None:
    w = make(watchdog_s=10)
    w.pinged(1)
    for t in range(2, 30):
        w.output_seen(float(t))
    assert w.check(11).verdict is Verdict.SILENT


def test_pings_keep_a_silent_phase_from_being_silent_without_watchdog_s() -> None:
    w = make(silence_s=5)
    w.observe(Event(job="j", attempt=1, kind=EventKind.PHASE, message="running", phase=Phase.RUNNING,
                    probe="train.phase"), 0)
    for t in range(1, 60):
        w.pinged(float(t))
        assert w.check(float(t)).verdict is Verdict.HEALTHY
    assert w.check(64).verdict is Verdict.SILENT  # five seconds after the last ping


def test_a_rank_slower_than_its_peers_for_n_steps_is_a_straggler_once() -> None:
    w = make(straggler_factor=2.0, straggler_steps=3)
    for rank in (0, 1, 2):
        step(w, rank, 1, 0.0)
    t = {0: 0.0, 1: 0.0, 2: 0.0}
    pace = {0: 1.0, 1: 1.1, 2: 3.0}
    found = []
    for done in range(2, 12):
        for rank in (0, 1, 2):
            t[rank] += pace[rank]
            step(w, rank, done, t[rank])
            found += w.stragglers()
    assert len(found) == 1  # one per streak
    s = found[0]
    assert s.process == "rank=2" and s.steps == 3 and s.peers == 2
    assert s.step_s == 3.0 and 1.0 <= s.peers_rate_s <= 1.1
    assert w.check(t[2]).verdict is Verdict.HEALTHY  # a warning, never a verdict


def test_a_streak_broken_starts_again_and_off_is_off() -> None:
    w = make(straggler_factor=2.0, straggler_steps=3)
    for rank in (0, 1):
        step(w, rank, 1, 0.0)
    t = {0: 0.0, 1: 0.0}
    for done in range(2, 30):
        t[0] += 1.0
        t[1] += 1.0 if done % 3 == 1 else 3.0  # two slow steps, then one at its peer's pace
        step(w, 0, done, t[0])
        step(w, 1, done, t[1])
    assert w.stragglers() == []
    off = make(straggler_factor="off")
    for rank in (0, 1):
        step(off, rank, 1, 0.0)
    for done in range(2, 20):
        step(off, 0, done, float(done))
        step(off, 1, done, 10.0 * done)
    assert off.stragglers() == []


def test_bars_without_a_process_are_never_compared() -> None:
    w = make(straggler_factor=2.0, straggler_steps=2)
    for done in range(1, 20):
        w.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="a", probe="train.steps",
                        data={"done": done, "total": 100, "desc": "fast"}), float(done))
        w.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="b", probe="train.steps",
                        data={"done": done, "total": 100, "desc": "slow"}), 10.0 * done)
    assert w.stragglers() == []


def test_a_new_daemon_counts_watchdog_s_from_when_it_listens_and_silence_from_the_log() -> None:
    w = make(watchdog_s=10, silence_s=30)
    w.output_seen(5.0)
    w.listening(100.0)  # re-adopted: the rule counts from here, not from the start
    assert w.check(109.9).verdict is Verdict.SILENT  # silence: 30 s after the last line, long passed
    assert "no output" in w.check(109.9).reason
    w = make(watchdog_s=10)
    w.listening(100.0)
    assert w.check(109.9).verdict is Verdict.HEALTHY
    judged = w.check(110)
    assert judged.verdict is Verdict.SILENT and "since the daemon began to listen" in judged.reason
