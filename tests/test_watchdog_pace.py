"""Stall bounds from earlier attempts' intervals (``PaceHistory``), where each bound came from, and
a step well over its history reported as slow (never a verdict).  History only loosens the floor,
unless the spec asks it to tighten (``learned_min_s``): a job that moves is never stalled."""

from __future__ import annotations

import pytest

from supervisor.core.events import BoundKind, Event, EventKind, Phase, Verdict
from supervisor.spec.model import HealthSpec
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
    assert (bound, str(source), source.kind) == (120.0, "stall_floor_s", BoundKind.DEFAULT_FLOOR)
    assert w.next_check_at() == pytest.approx(17.5 + 120)


def test_history_never_tightens_the_floor_unless_asked() -> None:
    # Earlier attempts loaded a shard in about 17.5 s: their bound (4.5 x 18.1 s) is under the 120 s
    # floor, and the floor holds: a cold page cache or a slow filesystem today is no stall.
    w, clock = make(history_of(EARLIER, EARLIER), stall_floor_s=120)
    w.observe(shard(0))
    clock.t = 17.5
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind, str(source)) == (120.0, BoundKind.DEFAULT_FLOOR, "stall_floor_s")
    clock.t = 17.5 + 119.9
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 17.5 + 120
    assert w.check().verdict is Verdict.STALLED


def test_a_slower_run_than_its_history_is_never_stalled_while_it_moves() -> None:
    # The reported case: a 20-shard load once at 0.2 s a shard, again at 2.5 s a shard (floor 120 s).
    w, clock = make(history_of([0.2] * 20), stall_floor_s=120)
    w.observe(shard(0, 20))
    for i in range(1, 21):
        for tick in range(1, 25):  # look every 0.1 s through each step, as the watch loop may
            clock.t = 2.5 * (i - 1) + 0.1 * tick
            assert w.check().verdict is Verdict.HEALTHY, (i, clock.t, w.check().reason)
        clock.t = 2.5 * i
        w.observe(shard(i, 20))
    # It was reported slow (against its history), which is no verdict.
    w2, clock2 = make(history_of([0.2] * 20), stall_floor_s=120, slow_floor_s=1)
    w2.observe(shard(0, 20))
    clock2.t = 2.4
    assert [key for key, _ in w2.slow()] == [f"{DESC}@0"]
    assert w2.check().verdict is Verdict.HEALTHY


def test_a_fast_crashed_attempt_does_not_bound_a_slow_steady_one() -> None:
    # An earlier attempt stepped every 0.05 s, then crashed; this one steps every 3 s, default floor.
    w, clock = make(history_of([0.05] * 40))
    w.observe(shard(0, 200))
    for i in range(1, 30):
        clock.t = 3.0 * i - 0.01
        assert w.check().verdict is Verdict.HEALTHY, i
        clock.t = 3.0 * i
        w.observe(shard(i, 200))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind) == (60.0, BoundKind.DEFAULT_FLOOR)


def test_history_loosens_a_floor_tighter_than_the_bar_is_known_to_need() -> None:
    # A bar known to take 90 s a step is not a stall at the 60 s floor.
    w, clock = make(history_of([88.0, 90.0, 91.0, 90.0]), stall_floor_s=60)
    w.observe(shard(0))
    [(_, bound, _, source)] = w.stall_bounds()
    assert bound == pytest.approx(1.5 * 3 * 91.0) and source.kind is BoundKind.HISTORY
    clock.t = 100.0  # a step a little slower than any seen
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 1.5 * 3 * 91.0
    assert w.check().verdict is Verdict.STALLED


def test_one_step_three_times_the_95th_percentile_is_no_stall() -> None:
    w, clock = make(history_of([90.0] * 20), stall_floor_s=60)
    w.observe(shard(0))
    clock.t = 90.0
    w.observe(shard(1))
    clock.t = 90.0 + 3 * 90.0
    assert w.check().verdict is Verdict.HEALTHY
    assert [key for key, _ in w.slow()] == [f"{DESC}@1"]  # slow, an alert: never a kill


def test_learned_min_lets_history_tighten_after_this_runs_first_interval() -> None:
    w, clock = make(history_of(EARLIER, EARLIER), stall_floor_s=600, learned_min_s=10)
    w.observe(shard(0))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind) == (600.0, BoundKind.DEFAULT_FLOOR)  # the first step: the floor
    clock.t = 17.0
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert bound == pytest.approx(1.5 * 3 * 18.1) and str(source) == "history (16 intervals from 2 runs)"
    clock.t = 17.0 + 300  # a relaunch knows after one shard that five minutes without one is wrong
    judgement = w.check()
    assert judgement.verdict is Verdict.STALLED
    assert "from history (16 intervals from 2 runs)" in judgement.reason


def test_learned_min_is_never_undercut_by_history_nor_by_this_runs_pace() -> None:
    w, clock = make(history_of([0.1] * 20), stall_floor_s=600, learned_min_s=5)
    w.observe(shard(0))
    clock.t = 0.1
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind, str(source)) == (5.0, BoundKind.LEARNED_MIN, "learned_min_s")
    # Slower today: 4 s a step.  k x this run's own median keeps it above its pace.
    for i in range(2, 6):
        clock.t = 0.1 + 4.0 * (i - 1)
        w.observe(shard(i))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, source.kind) == (12.0, BoundKind.THIS_RUN)


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
    assert report.evidence.to_json()["stall_bound_s"] == pytest.approx(120.0)  # the floor: history never tightens it
    # Past it, the next deadline is the stall, not the slow report again.
    assert w.next_check_at() == pytest.approx(17.5 + 120)
    clock.t = 17.5 + 120
    assert w.check().verdict is Verdict.STALLED
    assert w.slow() == []  # the stall is due: no slow report beside it


def test_a_run_slower_all_along_is_not_slow_at_every_step() -> None:
    # Every step at 3 x the history's: slow is measured against this run's own median once it has one.
    w, clock = make(history_of([1.0] * 10), stall_floor_s=120, slow_floor_s=1)
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


def test_a_floor_reads_as_set_and_names_the_field_that_set_it() -> None:
    # A monotonic clock reading where (t + 600) - t is 599.9999999999418: shown once as 9m59s.
    w, clock = make(None, stall_floor_s=600)
    clock.t = 523900.315
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, str(source)) == (600.0, "stall_floor_s")
    w = Watchdog(HealthSpec(stall_floor_by_phase={Phase.WEIGHT_LOADING: 90}), clock=clock)
    w.observe(shard(1))
    [(_, bound, _, source)] = w.stall_bounds()
    assert (bound, str(source)) == (90.0, "stall_floor_by_phase.weight_loading")
    assert w.check(clock.t + 90).reason.endswith("(bound 90.0s = stall_floor_by_phase.weight_loading; "
                                                 "no interval measured yet)")
    w = Watchdog(HealthSpec(), clock=clock)  # the default: said so
    w.observe(shard(1))
    assert str(w.stall_bounds()[0][3]) == "default floor"


def test_a_hiccup_of_a_fast_bar_is_not_slow_until_it_has_lasted_the_slow_floor() -> None:
    # The reported case: a shard bar at 0.15 s a step, and one step of 0.5 s: slow against its history
    # (2 x its 95th percentile is 0.3 s), yet a hiccup.  Slow only once the step has lasted 30 s.
    w, clock = make(history_of([0.15] * 40))
    w.observe(shard(0))
    clock.t = 0.5
    assert w.slow() == []
    assert w.next_check_at() == pytest.approx(30.0)  # the slow report's deadline: the floor, not 0.3 s
    clock.t = 30.0
    [(key, report)] = w.slow()
    assert key == f"{DESC}@0" and "this step has taken 30.0s, over 30.0s" in report.reason
    # Set in the spec, the floor is the spec's.
    w, clock = make(history_of([0.15] * 40), slow_floor_s=5)
    w.observe(shard(0))
    clock.t = 4.9
    assert w.slow() == []
    clock.t = 5.0
    assert [key for key, _ in w.slow()] == [f"{DESC}@0"]


def test_advances_read_together_measure_nothing_apart() -> None:
    """The first shards of a load read in one batch (a daemon starting as the job did) share the
    read's time: their spacing is unknown, so no 0 s interval is learned ("0.00 s/it" was shown);
    the next distinct time measures all their items as one interval."""
    from supervisor.watchdog._progress import Track

    track = Track("vllm.shards", 0, 13, 100.0)
    track.advance(1, 101.0)
    track.advance(2, 101.0)  # read with the one before
    track.advance(3, 101.0)
    track.advance(4, 101.9)
    assert list(track.intervals) == pytest.approx([1.0, 0.9])
    assert list(track.per_item) == pytest.approx([1.0, 0.3])  # 0.9 s over the three items since 101.0
    assert track.done == 4 and track.last_advance_at == 101.9
    track.advance(5, 101.5)  # a time before the last (a backlog's estimate): no negative interval either
    assert track.done == 5 and len(track.intervals) == 2 and track.last_advance_at == 101.9
