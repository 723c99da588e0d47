"""A known wait (``paused`` heartbeats) on an injected clock: the lines the eagle3 jobs print while a disk
budget pauses them, read by the shipped packs, hold the stall and silence clocks while they come; a wait whose
lines stop is judged from the last one; the time waited is not the bar's; a plain heartbeat holds nothing."""

from __future__ import annotations

from typing import Any

from probe_helpers import events_of

from supervisor.core.events import Event, Verdict
from supervisor.jobs.runner._watching import _from_probe
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog

PAUSED = ("extract paused: 155163 bytes not consumed yet, the next batch needs about 378470, budget 1000 "
          "(151.5 KiB unconsumed, 1000 B budget); waiting {}s for training to release samples")
WAITING = "train waiting: sample 4 not extracted yet (extraction paused or behind; {}s)"


def events(*lines: str) -> list[Event]:
    """What the shipped packs make of the jobs' lines, as the runner feeds them to the watchdog."""
    return [_from_probe("j", 1, pe) for pe in events_of(list(lines))]


def feed(w: Watchdog, at: float, *lines: str) -> None:
    w.output_seen(at)
    for e in events(*lines):
        w.observe(e, at)


def make(**health: Any) -> Watchdog:
    return Watchdog(HealthSpec(**{"stall_floor_s": 3, "silence_s": 3, **health}), clock=lambda: 0.0, started_at=0.0)


def test_the_jobs_wait_lines_are_paused_heartbeats_and_their_ends_are_plain_info() -> None:
    for line in (PAUSED.format(3), WAITING.format(3), "train waiting: no manifest.json in /d yet (the extraction "
                                                     "has not started; 0s)"):
        (e,) = events(line)
        assert (e.data["heartbeat"], e.data["paused"]) == (True, True), line
    for line in ("extract resumed after 12.5s: training consumed through sample 4", "train waited 3.1s for its samples"):
        (e,) = events(line)
        assert e.kind.value == "info" and "heartbeat" not in e.data, line


def test_a_wait_said_every_second_outlasts_the_stall_floor_and_the_silence_and_status_says_it() -> None:
    w = make()
    feed(w, 0, "extract phase: extracting", "extract progress: 4/12 samples, 50.0 tok/s")
    for t in range(1, 30):
        feed(w, float(t), PAUSED.format(t - 1))
        judged = w.check(t + 0.9)
        assert judged.verdict is Verdict.HEALTHY, judged.reason
    assert "paused for 28.9s: extract paused: 155163 bytes" in judged.reason
    assert w.paused == (1.0, PAUSED.format(28))
    # Lines stop coming (the process hangs while paused): judged three seconds after the last one.
    assert w.check(31.9).verdict is Verdict.HEALTHY
    judged = w.check(32)
    assert judged.verdict is Verdict.STALLED, judged.reason
    assert "paused and no word of it for 3.0s" in judged.reason and "waiting 28s for training" in judged.reason


def test_the_time_waited_is_not_the_bars_and_a_wait_ended_is_no_longer_shown() -> None:
    w = make(silence_s=None)
    feed(w, 0, "extract phase: extracting", "extract progress: 4/12 samples, 50.0 tok/s")
    for t in range(1, 20):
        feed(w, float(t), PAUSED.format(t - 1))
    feed(w, 20, "extract resumed after 19.0s: training consumed through sample 4")
    assert w.paused is None and "paused" not in w.check(20).reason
    assert w.check(22.9).verdict is Verdict.HEALTHY  # counted from the end of the wait, not from step 4 at 0 s
    assert w.check(23).verdict is Verdict.STALLED


def test_the_trainer_waiting_on_extraction_is_a_known_wait_too() -> None:
    w = make()
    feed(w, 0, "train phase: training", "train step 1/3 loss=5.0000 acc0=0.100 tok/s=10.0")
    for t in range(1, 15):
        feed(w, float(t), WAITING.format(t - 1))
        assert w.check(t + 0.9).verdict is Verdict.HEALTHY
    feed(w, 15, "train waited 14.0s for its samples")
    assert w.check(17.9).verdict is Verdict.HEALTHY and w.check(18).verdict is Verdict.STALLED


def test_a_plain_still_waiting_heartbeat_holds_no_bar() -> None:
    # vLLM's shared-memory wait is a heartbeat, not a known wait: a loading bar behind it still stalls.
    w = make(silence_s=None)
    feed(w, 0, "extract phase: extracting", "extract progress: 4/12 samples, 50.0 tok/s")
    for t in range(1, 6):
        w.observe(Event(job="j", attempt=1, kind=events(PAUSED.format(0))[0].kind, message="still waiting",
                        probe="x.wait", data={"heartbeat": True}), float(t))
    assert w.check(3).verdict is Verdict.STALLED
