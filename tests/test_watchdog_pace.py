"""Stall bounds from earlier attempts' intervals (``PaceHistory``), where each bound came from, and
a step well over its history reported as slow (never a verdict)."""

from __future__ import annotations

import pytest

from supervisor.events import BoundKind, Event, EventKind, Phase, Verdict
from supervisor.spec import HealthSpec
from supervisor.watchdog import BarPace, PaceHistory, Watchdog, bar_key

SHARDS = "vllm.shards"
DESC = "Loading safetensors checkpoint shards"
KEY = bar_key(SHARDS, DESC)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def shard(done: int, total: int = 64) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="bar", probe=SHARDS,
                 phase=Phase.WEIGHT_LOADING, data={"done": done, "total": total, "desc": DESC})


def make(history: PaceHistory | None, **health: float) -> tuple[Watchdog, Clock]:
    clock = Clock()
    return Watchdog(HealthSpec(**health), clock=clock, history=history), clock


def history_of(*runs: list[float]) -> PaceHistory:
    return PaceHistory({KEY: BarPace.of(KEY, runs)})


# A 64-shard load at about 17.5 s a shard, as an earlier attempt measured it.
EARLIER = [17.2, 17.5, 17.9, 17.4, 17.6, 17.3, 18.1, 17.5]


def test_without_history_the_first_shards_wait_for_the_floor() -> None:
    w, clock = make(None, stall_floor_s=120)
    w.observe(shard(0))
    clock.t = 17.5
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, str(source), source.kind) == (120.0, "default floor", BoundKind.DEFAULT_FLOOR)
    assert w.next_check_at() == pytest.approx(17.5 + 120)


def test_with_history_the_bound_is_set_from_the_first_shard_on() -> None:
    w, clock = make(history_of(EARLIER, EARLIER), stall_floor_s=120)
    w.observe(shard(0))
    [(_, bound, _, source)] = w.stall_bounds()
    # k x the 95th percentile of 16 intervals (18.1 s): well under the 120 s floor, well over a shard.
    assert bound == pytest.approx(3 * 18.1)
    assert str(source) == "history (16 intervals from 2 runs)"
    assert (source.kind, source.intervals, source.runs) == (BoundKind.HISTORY, 16, 2)
    clock.t = 17.5
    w.observe(shard(1))
    clock.t = 17.5 + 3 * 18.1 - 0.01
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 17.5 + 3 * 18.1
    judgement = w.check()
    assert judgement.verdict is Verdict.STALLED
    assert judgement.evidence["bound_source"] == "history (16 intervals from 2 runs)"
    assert "from history (16 intervals from 2 runs)" in judgement.reason


def test_a_relaunch_knows_after_one_shard_that_five_minutes_is_wrong() -> None:
    w, clock = make(history_of(EARLIER), stall_floor_s=600)
    w.observe(shard(0))
    clock.t = 17.0
    w.observe(shard(1))
    clock.t = 17.0 + 300
    assert w.check().verdict is Verdict.STALLED


def test_once_this_run_is_slower_its_own_median_takes_over() -> None:
    # The disk is slower today: k x this run's median beats the history's bound, and says so.
    w, clock = make(history_of([1.0] * 10), stall_floor_s=120)
    w.observe(shard(0))
    for i in range(1, 5):
        clock.t = 10.0 * i
        w.observe(shard(i))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, str(source)) == (30.0, "this run")


def test_a_longest_interval_seen_before_is_no_stall_again() -> None:
    # One pause (a checkpoint every N steps) stands out of the percentile: 1.5 x it bounds.
    runs = [[1.0] * 40 + [30.0]]
    pace = BarPace.of(KEY, runs)
    assert pace.bound(3.0) == pytest.approx(45.0)


def test_history_never_loosens_a_tighter_floor() -> None:
    w, _ = make(history_of(EARLIER), stall_floor_s=30)
    w.observe(shard(0))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind) == (30.0, BoundKind.DEFAULT_FLOOR)


def test_history_of_another_bar_is_not_used() -> None:
    other = bar_key(SHARDS, "Loading pt checkpoint shards")
    w, _ = make(PaceHistory({other: BarPace.of(other, [EARLIER])}), stall_floor_s=120)
    w.observe(shard(0))
    assert w.stall_bounds()[0][3].kind is BoundKind.DEFAULT_FLOOR


def test_a_step_well_over_its_history_is_slow_before_it_is_a_stall() -> None:
    w, clock = make(history_of(EARLIER), stall_floor_s=120)
    w.observe(shard(0))
    clock.t = 17.5
    w.observe(shard(1))
    slow_at = 17.5 + 2 * 18.1
    # The watch loop wakes for it, and it is never the verdict.
    assert w.next_check_at() == pytest.approx(slow_at)
    assert w.upcoming() is not None and w.upcoming()[1] is Verdict.STALLED
    clock.t = slow_at - 0.01
    assert w.slow() == []
    clock.t = slow_at + 1
    assert w.check().verdict is Verdict.HEALTHY
    [(key, report)] = w.slow()
    assert key.endswith("@1")
    assert "over 36.2s" in report.reason and "95th percentile 18.1s" in report.reason
    assert report.evidence["stall_bound_s"] == pytest.approx(3 * 18.1)
    # Past it, the next deadline is the stall, not the slow report again.
    assert w.next_check_at() == pytest.approx(17.5 + 3 * 18.1)
    clock.t = 17.5 + 3 * 18.1
    assert w.check().verdict is Verdict.STALLED
    assert w.slow() == []  # the stall is due: no slow report beside it


def test_a_run_slower_all_along_is_not_slow_at_every_step() -> None:
    # Every step at 3 x the history's: slow is measured against this run's own median once it has one.
    w, clock = make(history_of([1.0] * 10), stall_floor_s=120)
    w.observe(shard(0))
    for i in range(1, 6):
        clock.t = 3.0 * i
        w.observe(shard(i))
        clock.t += 2.9
        assert (w.slow() == []) == (i >= 3), i  # the first steps, before its own median, were slow
    clock.t = 15.0 + 2 * 3.0 + 0.1
    assert [key for key, _ in w.slow()] == [f"{DESC}@5"]


def test_no_slow_report_without_history() -> None:
    w, clock = make(None, stall_floor_s=120)
    w.observe(shard(0))
    clock.t = 100.0
    assert w.slow() == []


def test_the_watchdog_hands_its_intervals_on_by_bar() -> None:
    w, clock = make(None)
    w.observe(shard(0))
    for i, at in enumerate((2.0, 5.0, 9.0), start=1):
        clock.t = at
        w.observe(shard(i))
    assert w.paces() == {KEY: [2.0, 3.0, 4.0]}
    assert w.anew().paces() == {}


def test_a_pace_from_intervals_skips_what_is_not_a_duration() -> None:
    pace = BarPace.of(KEY, [[1.0, float("nan"), -1.0, 2.0], []])
    assert pace.intervals == (1.0, 2.0) and pace.runs == 1
    assert PaceHistory({KEY: BarPace.of(KEY, [[]])}).get(KEY) is None
