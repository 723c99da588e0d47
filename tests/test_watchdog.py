"""The watchdog: judgements from event sequences on a fake clock, and a replay of real pacing."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.events import Event, EventKind, Failure, FailureKind, Phase, Verdict
from supervisor.probes import replay_file
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Judgement, Watchdog, format_duration

DATA = Path(__file__).parent / "data"


class Clock:
    """A plain mutable time source."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def phase(p: Phase) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PHASE, message=p.value, phase=p, probe="vllm.phase")


def progress(done: int, total: int | None = 64, probe: str = "vllm.shards") -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="bar", probe=probe,
                 data={"done": done, "total": total})


def heartbeat() -> Event:
    return Event(job="j", attempt=1, kind=EventKind.INFO, message="waiting", data={"heartbeat": True})


def failure(kind: str = "runtime_error", line: str = "RuntimeError: boom", fp: str = "fp1",
            level: str | None = None) -> Event:
    tb = "Traceback (most recent call last):\n" + "".join(f'  File "x.py", line {i}, in f\n' for i in range(30)) + line
    return Event(job="j", attempt=1, kind=EventKind.FAILURE, message=line, probe="python.traceback",
                 failure=Failure(FailureKind(kind), line, fp, tb, level))


def make(**health: Any) -> tuple[Watchdog, Clock]:
    clock = Clock()
    return Watchdog(HealthSpec(**health), clock=clock), clock


def advance(w: Watchdog, clock: Clock, done: int, at: float, total: int | None = 64) -> None:
    clock.t = at
    w.observe(progress(done, total))


# ---- stuck progress ----------------------------------------------------------------------


def test_stall_bound_is_k_times_median_interval_and_reason_reads_well() -> None:
    w, clock = make(stall_floor_s=10)
    w.observe(phase(Phase.WEIGHT_LOADING))
    for i in range(46):  # 0/64 .. 45/64, one shard every 17.6 s
        advance(w, clock, i, 17.6 * i)
    clock.t = 17.6 * 45 + 190
    j = w.check()
    assert j.verdict == Verdict.STALLED
    assert j.reason == "shard 45/64, no progress for 3m10s (bound 52.8s = 3 x median 17.6 s/it)"
    assert j.evidence.to_json()["probe"] == "vllm.shards"
    assert (j.evidence.to_json()["done"], j.evidence.to_json()["total"]) == (45, 64)
    assert j.evidence.to_json()["stalled_s"] == pytest.approx(190.0)
    assert j.evidence.to_json()["median_interval_s"] == pytest.approx(17.6)
    assert j.evidence.to_json()["bound_s"] == pytest.approx(52.8)


def test_not_stalled_just_before_the_bound_and_stalled_at_it() -> None:
    w, clock = make(stall_floor_s=1)
    for i in range(5):
        advance(w, clock, i, 2.0 * i)  # median 2 s -> bound 6 s after the advance at t=8
    assert w.next_check_at() == pytest.approx(14.0)
    assert w.check(13.99).verdict == Verdict.HEALTHY
    deadline = w.next_check_at()
    assert deadline is not None
    assert w.check(deadline).verdict == Verdict.STALLED  # waking exactly then sees it


def test_floor_applies_when_k_times_median_is_smaller() -> None:
    w, clock = make()  # default floor 60 s
    for i in range(5):
        advance(w, clock, i, 0.15 * i)
    assert w.check(0.6 + 59.9).verdict == Verdict.HEALTHY
    j = w.check(0.6 + 60.0)
    assert j.verdict == Verdict.STALLED
    assert j.evidence.to_json()["bound_s"] == 60.0
    assert "stall floor" in j.reason


def test_per_phase_floor() -> None:
    w, clock = make(stall_floor_s=60, stall_floor_by_phase={Phase.WEIGHT_LOADING: 5})
    w.observe(phase(Phase.WEIGHT_LOADING))
    for i in range(3):
        advance(w, clock, i, 0.1 * i)
    assert w.check(0.2 + 5.0).verdict == Verdict.STALLED


def test_progress_resuming_clears_the_stall() -> None:
    w, clock = make(stall_floor_s=5)
    for i in range(4):
        advance(w, clock, i, float(i))
    assert w.check(3 + 10).verdict == Verdict.STALLED
    advance(w, clock, 4, 13.0)
    assert w.check().verdict == Verdict.HEALTHY
    assert w.progress is not None and w.progress.done == 4


def test_a_repeated_done_is_not_an_advance() -> None:
    w, clock = make(stall_floor_s=5)
    advance(w, clock, 0, 0.0)
    advance(w, clock, 1, 1.0)
    for t in (2.0, 3.0, 4.0, 5.0):
        advance(w, clock, 1, t)  # the same bar redrawn
    assert w.check(6.0).verdict == Verdict.STALLED
    assert w.check(6.0).evidence.to_json()["stalled_s"] == pytest.approx(5.0)


def test_heartbeats_are_output_but_not_progress() -> None:
    w, clock = make(stall_floor_s=5, silence_s=3, silence_phases=[Phase.WEIGHT_LOADING])
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 0, 0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        clock.t = t
        w.observe(heartbeat())
    j = w.check(6.5)
    assert j.verdict == Verdict.STALLED  # heartbeats did not reset the stall clock...
    assert "also" not in j.evidence.to_json()  # ...but they did keep it from being silent


def test_only_waiting_lines_in_a_start_up_phase_is_a_stall() -> None:
    # A rank froze after loading: the engine says "still waiting" every 60 s, forever.
    w, clock = make(waiting_s=600, stall_floor_s=3e7)
    w.observe(phase(Phase.WEIGHT_LOADING))
    clock.t = 10.0
    w.output_seen(heartbeats_only=False)
    for t in range(70, 700, 60):
        clock.t = float(t)
        w.output_seen(heartbeats_only=True)
        w.observe(heartbeat())
    assert w.check(609.9).verdict == Verdict.HEALTHY
    j = w.check(610.0)
    assert j.verdict == Verdict.STALLED
    assert j.reason == "only 'still waiting' lines for 10m00s in start-up phase weight_loading (limit 10m00s): waiting"


def test_no_output_at_all_in_a_start_up_phase_is_a_stall() -> None:
    # Seen on 2 H200s: rank 1 frozen while loading; rank 0 loaded, then the log went silent for good.
    w, clock = make(waiting_s=1800)
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 13, 12.0, total=13)  # rank 0's bar, finished: no stall rule left
    assert w.next_check_at(12.0) == 1812.0
    j = w.check(1812.0)
    assert j.verdict == Verdict.STALLED
    assert j.reason == "no output for 30m00s in start-up phase weight_loading (limit 30m00s)"


def test_quiet_is_no_stall_once_ready_after_real_output_or_before_any_phase() -> None:
    ready, clock = make(waiting_s=60)
    ready.observe(phase(Phase.ENGINE_READY))  # an idle server may print them, or nothing
    clock.t = 1.0
    ready.observe(heartbeat())
    assert ready.check(1e6).verdict == Verdict.HEALTHY
    busy, clock = make(waiting_s=60)
    busy.observe(phase(Phase.KV_CACHE_PROFILE))
    clock.t = 30.0
    busy.observe(heartbeat())
    clock.t = 50.0
    busy.output_seen()  # it printed something else since: the count starts again
    assert busy.check(109.9).verdict == Verdict.HEALTHY
    assert busy.check(110.0).reason == "no output for 1m00s in start-up phase kv_cache_profile (limit 1m00s)"
    unknown, _ = make(waiting_s=60)  # no phase recognised: the waiting rule does not apply (silence does, later)
    assert unknown.check(1000).verdict == Verdict.HEALTHY
    off, _ = make(waiting_s=None)
    off.observe(phase(Phase.KV_CACHE_PROFILE))
    off.observe(heartbeat())
    assert off.check(1e6).verdict == Verdict.HEALTHY


def test_waiting_lines_after_a_failure_do_not_hide_the_hang() -> None:
    w, clock = make(hang_after_failure_s=120, waiting_s=None)
    w.observe(failure(line="RuntimeError: rank 1 died"))
    for t in (60.0, 120.0):
        clock.t = t
        w.output_seen(heartbeats_only=True)
        w.observe(heartbeat())
    assert w.check(120.0).verdict == Verdict.CRASHED


def test_first_progress_bound_before_any_interval_is_known() -> None:
    w, clock = make(stall_floor_s=60, first_progress_s={Phase.WEIGHT_LOADING: 20})
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 0, 1.0)
    assert w.check(20.9).verdict == Verdict.HEALTHY
    j = w.check(21.0)
    assert j.verdict == Verdict.STALLED
    assert j.evidence.to_json()["bound_s"] == 20
    assert "first advance expected" in j.reason


def test_first_progress_applies_when_no_bar_ever_appears() -> None:
    w, clock = make(first_progress_s={Phase.WEIGHT_LOADING: 30})
    clock.t = 10
    w.observe(phase(Phase.WEIGHT_LOADING))
    assert w.next_check_at() == pytest.approx(40)
    j = w.check(40)
    assert j.verdict == Verdict.STALLED
    assert "no progress shown" in j.reason


def test_a_finished_bar_is_no_longer_watched() -> None:
    w, clock = make(stall_floor_s=5)
    for i in range(14):
        advance(w, clock, i, 0.1 * i, total=13)
    advance(w, clock, 13, 1.5, total=13)  # the 100% bar printed twice
    assert w.check(1000).verdict == Verdict.HEALTHY
    assert w.next_check_at() == pytest.approx(1.5 + 1800)  # no stall: only the silence bound before any phase


def test_a_bar_that_restarts_is_a_new_bar() -> None:
    w, clock = make(stall_floor_s=5)
    for i in range(51):
        advance(w, clock, i, 0.01 * i, total=51)  # CUDA graphs, first pass
    advance(w, clock, 0, 1.0, total=51)  # second pass from 0
    assert w.progress is not None and w.progress.done == 0
    assert w.check(5.9).verdict == Verdict.HEALTHY
    assert w.check(6.0).verdict == Verdict.STALLED


def test_a_later_phase_retires_earlier_bars() -> None:
    w, clock = make(stall_floor_s=5)
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 3, 0.0)
    advance(w, clock, 4, 1.0)  # never reaches 64/64 (a bar with leave=False)
    w.observe(phase(Phase.KV_CACHE_PROFILE))
    assert w.check(100).verdict == Verdict.HEALTHY


def test_progress_of_an_earlier_phase_is_still_shown() -> None:
    w, clock = make()
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 63, 0.0)
    w.observe(phase(Phase.KV_CACHE_PROFILE))
    assert w.progress is not None and w.progress.done == 63
    advance(w, clock, 64, 1.0)  # a late redraw of it is followed as a new bar
    assert w.progress is not None and w.progress.done == 64


def test_phases_only_move_forward() -> None:
    w, clock = make(phase_deadline_s={Phase.WEIGHT_LOADING: 100})
    w.observe(phase(Phase.WEIGHT_LOADING))
    clock.t = 50
    w.observe(phase(Phase.MODEL_INIT))  # another rank, late
    w.observe(phase(Phase.WEIGHT_LOADING))  # not a re-entry: the deadline clock keeps running
    assert w.phase == Phase.WEIGHT_LOADING
    assert w.next_check_at() == pytest.approx(100)


def test_progress_state_rate_and_eta() -> None:
    w, clock = make()
    advance(w, clock, 0, 0.0, total=10)
    advance(w, clock, 2, 4.0, total=10)  # two items in one advance: 2 s/it
    advance(w, clock, 3, 6.0, total=10)
    state = w.progress
    assert state is not None
    assert (state.probe, state.done, state.total) == ("vllm.shards", 3, 10)
    assert state.rate == pytest.approx(2.0)
    assert state.eta_s == pytest.approx(14.0)
    assert state.last_advance_at == 6.0


def test_string_fields_from_regex_captures_are_accepted() -> None:
    w, _clock = make(stall_floor_s=5)
    w.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="", probe="p.steps",
                    data={"done": "7", "total": "9"}))
    assert w.progress is not None and (w.progress.done, w.progress.total) == (7, 9)


# ---- silence and phase deadlines --------------------------------------------------------


def test_silence_in_a_listed_phase() -> None:
    w, clock = make(silence_s=30, silence_phases=[Phase.RUNNING])
    w.observe(phase(Phase.RUNNING))
    clock.t = 10
    w.output_seen()
    assert w.next_check_at() == pytest.approx(40)
    assert w.check(39.9).verdict == Verdict.HEALTHY
    j = w.check(40)
    assert j.verdict == Verdict.SILENT
    assert j.evidence.to_json()["silent_s"] == pytest.approx(30)
    assert "no output for 30.0s" in j.reason
    w.output_seen(41)
    assert w.check(41).verdict == Verdict.HEALTHY


def test_silence_is_not_judged_outside_the_listed_phases() -> None:
    w, _clock = make(silence_s=30, silence_phases=[Phase.RUNNING], waiting_s=None)
    w.observe(phase(Phase.MODEL_INIT))
    assert w.check(1000).verdict == Verdict.HEALTHY
    assert w.next_check_at() is None


def test_silence_before_any_phase_has_its_own_bound_and_silence_s_shortens_it() -> None:
    quiet, _ = make()  # a program that prints nothing and reaches no phase is judged in the end
    assert quiet.next_check_at() == pytest.approx(1800)
    j = quiet.check(1800)
    assert j.verdict == Verdict.SILENT and "before any phase" in j.reason
    short, _ = make(silence_s=10)  # the user's silence bound applies before any phase too
    assert short.check(9.9).verdict == Verdict.HEALTHY
    assert short.check(10).verdict == Verdict.SILENT
    assert make(silence_s=10)[0].next_check_at() == pytest.approx(10)
    long, _ = make(silence_s=5000, silence_before_phase_s=60)
    assert long.check(60).verdict == Verdict.SILENT


def test_phase_deadline() -> None:
    w, clock = make(phase_deadline_s={Phase.MODEL_INIT: 600})
    clock.t = 5
    w.observe(phase(Phase.MODEL_INIT))
    j = w.check(5 + 601)
    assert j.verdict == Verdict.STALLED
    assert j.reason.startswith("phase model_init exceeded its deadline of 10m00s")
    assert j.evidence.to_json()["deadline_s"] == 600


def test_leaving_a_phase_in_time_meets_its_deadline() -> None:
    w, clock = make(phase_deadline_s={Phase.MODEL_INIT: 600}, waiting_s=None)
    w.observe(phase(Phase.MODEL_INIT))
    clock.t = 599
    w.observe(phase(Phase.WEIGHT_LOADING))
    assert w.check(10_000).verdict == Verdict.HEALTHY


def test_the_rule_broken_first_is_the_verdict() -> None:
    w, clock = make(stall_floor_s=5, silence_s=20, silence_phases=[Phase.WEIGHT_LOADING])
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 0, 0.0)
    advance(w, clock, 1, 1.0)
    j = w.check(30)
    assert j.verdict == Verdict.STALLED
    assert len(j.evidence.to_json()["also"]) == 1 and "no output" in j.evidence.to_json()["also"][0]


def test_next_check_at_is_the_earliest_pending_rule() -> None:
    w, clock = make(stall_floor_s=50, silence_s=20, silence_phases=[Phase.WEIGHT_LOADING],
                    phase_deadline_s={Phase.WEIGHT_LOADING: 500})
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 0, 3.0)
    assert w.next_check_at() == pytest.approx(23.0)  # silence first
    assert w.next_check_at(now=23.0) == pytest.approx(53.0)  # then the stall, then the deadline
    assert w.next_check_at(now=53.0) == pytest.approx(500.0)


def test_the_windowed_median_matches_statistics_median() -> None:
    import random
    import statistics
    from collections import deque

    from supervisor.watchdog._progress import _median, _push

    rng = random.Random(7)
    window: deque[float] = deque(maxlen=16)
    ordered: list[float] = []
    for _ in range(2000):  # ties and repeats included: the removal must take out one equal value
        _push(window, ordered, rng.choice([rng.random(), 0.5, 1.0]))
        assert ordered == sorted(window)
        assert _median(ordered) == pytest.approx(statistics.median(window), abs=1e-12)


# ---- hung after a failure ------------------------------------------------------------------


def test_a_failure_then_silence_is_a_crash_while_the_process_still_runs() -> None:
    # One rank raised; the others wait in their next collective and print nothing more.
    w, clock = make(hang_after_failure_s=120, stall_floor_s=3e7)
    advance(w, clock, 3, 10.0, total=None)
    clock.t = 11.0
    w.observe(failure(line="RuntimeError: rank 1: bad batch at step 5", fp="fpbad"))
    assert w.next_check_at() == 131.0
    # What `status` shows meanwhile: the rule that comes due first, and what it would say.
    assert w.upcoming(11.0) == (131.0, Verdict.CRASHED,
                                "hung after a failure, no output for 2m00s: RuntimeError: rank 1: bad batch at step 5")
    assert w.check(130.9).verdict == Verdict.HEALTHY
    j = w.check(131.0)
    assert j.verdict == Verdict.CRASHED
    assert j.reason == "hung after a failure, no output for 2m00s: RuntimeError: rank 1: bad batch at step 5"
    assert j.evidence.to_json()["fingerprint"] == "fpbad" and j.evidence.to_json()["hang_after_failure_s"] == 120
    # Killed by us for it: the exit keeps that verdict, whatever signal ended it.
    assert w.exited(None, 15, killed_by_us=True).reason == j.reason
    assert w.upcoming() is None


def test_output_after_the_failure_pushes_the_hang_deadline() -> None:
    w, clock = make(hang_after_failure_s=30)
    clock.t = 5.0
    w.observe(failure())
    clock.t = 20.0
    w.output_seen()  # shutdown messages, a second rank's traceback: not yet hung
    assert w.check(34.0).verdict == Verdict.HEALTHY
    assert w.next_check_at() == 50.0
    assert w.check(50.0).verdict == Verdict.CRASHED


def test_the_first_failure_since_the_last_advance_is_blamed() -> None:
    w, clock = make(hang_after_failure_s=30)
    advance(w, clock, 1, 0.5)
    w.observe(failure(line="ValueError: first, recovered from", fp="a"))
    advance(w, clock, 2, 1.0)
    w.observe(failure(line="RuntimeError: the cause", fp="b"))
    w.observe(failure(line="RuntimeError: a consequence", fp="c"))
    j = w.check(100.0)
    assert j.verdict == Verdict.CRASHED and j.evidence.to_json()["fingerprint"] == "b"


@pytest.mark.parametrize("recovery", ["phase", "progress"])
def test_a_phase_or_progress_after_the_failure_is_a_recovery(recovery: str) -> None:
    # vLLM logs a full traceback at WARNING during a healthy --skip-tokenizer-init start, then
    # becomes ready and sits idle: it must not be called hung.
    w, clock = make(hang_after_failure_s=30, stall_floor_s=3e7, waiting_s=None)
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 1, 1.0)
    w.observe(failure(kind="value_error", line="ValueError: Tokenizer not available"))
    if recovery == "phase":
        w.observe(phase(Phase.ENGINE_READY))
    else:
        advance(w, clock, 2, 2.0)
    assert w.check(10_000.0).verdict == Verdict.HEALTHY
    assert w.next_check_at(10_000.0) is None or recovery == "progress"


def test_a_ready_server_that_logged_a_failure_and_idles_is_not_hung() -> None:
    w, clock = make(hang_after_failure_s=30)
    w.observe(phase(Phase.ENGINE_READY))
    clock.t = 5.0
    w.observe(failure(line="ValueError: prompt too long for this model"))
    assert w.check(1e6).verdict == Verdict.HEALTHY
    assert w.upcoming(1e6) is None


def test_a_traceback_logged_at_warning_does_not_arm_the_hang_rule() -> None:
    w, _ = make(hang_after_failure_s=30, silence_before_phase_s=3e7)
    warned = failure(line="ValueError: Tokenizer not available when `skip_tokenizer_init=True`", level="WARNING")
    w.observe(warned)
    assert w.check(1e6).verdict == Verdict.HEALTHY
    errored = failure(line="RuntimeError: boom", level="ERROR")
    w.observe(errored)
    assert w.check(1e6).verdict == Verdict.CRASHED


def test_an_oom_then_hang_is_oom_and_the_rule_can_be_turned_off() -> None:
    w, _ = make(hang_after_failure_s=60)
    w.observe(failure(kind=FailureKind.CUDA_OOM, line="torch.OutOfMemoryError: CUDA out of memory."))
    assert w.check(60.0).verdict == Verdict.OOM
    off, _ = make(hang_after_failure_s=None, silence_before_phase_s=3e7)
    off.observe(failure())
    assert off.check(1e7).verdict == Verdict.HEALTHY and off.next_check_at() == pytest.approx(3e7)  # only silence is left


def test_state_is_one_consistent_look() -> None:
    w, clock = make(stall_floor_s=10, hang_after_failure_s=None, waiting_s=None)
    empty = w.state()
    assert (empty.phase, empty.progress, empty.failure, empty.failures_seen) == (None, None, None, 0)
    w.observe(phase(Phase.WEIGHT_LOADING))
    advance(w, clock, 1, 2.0)
    advance(w, clock, 2, 4.0)
    w.observe(failure(line="ValueError: first", fp="a"))
    w.observe(failure(kind="key_error", line="KeyError: latest", fp="b", level="ERROR"))
    state = w.state()
    assert state.phase is Phase.WEIGHT_LOADING and state.phase_entered_at == 0.0
    assert state.progress == w.progress and state.progress is not None and state.progress.done == 2
    # The root cause, as the attempt stores it and the judgement blames: the first error line.
    assert state.failure is not None and (state.failure.line, state.failure.fingerprint) == ("ValueError: first", "a")
    assert w.failure == state.failure
    assert state.failures_seen == 2 and state.last_output_at == 4.0
    assert state.next_check_at == w.next_check_at() == 14.0  # the stall floor after the last advance
    assert w.exited(1, None, killed_by_us=False).evidence.to_json()["fingerprint"] == "a"
    assert w.state().next_check_at is None


def _corpus_events(path: Path) -> list[Event]:
    report = replay_file(path)
    events = []
    for e in report.events:
        level = e.fields.get("level")  # the report's JSON keeps a failure's level among its fields
        found = None if e.failure is None else Failure(e.failure, e.line, e.fingerprint, e.traceback, level)
        events.append(Event(job="j", attempt=1, kind=EventKind(e.kind.value), message=e.line, probe=e.probe,
                            phase=e.phase, offset=e.offset, data=dict(e.fields), failure=found))
    return events


def _corpus_labels() -> list[tuple[Path, str]]:
    cases = []
    for folder in ("vllm-logs", "full-logs", "device-logs"):
        labels = tomllib.loads((DATA / "corpus" / folder / "labels.toml").read_text())["log"]
        cases += [(DATA / "corpus" / folder / label["file"], label["outcome"]) for label in labels]
    return cases


@pytest.mark.parametrize(("path", "outcome"), _corpus_labels(), ids=lambda v: getattr(v, "name", v))
def test_on_real_logs_only_failed_runs_leave_a_failure_unrecovered(path: Path, outcome: str) -> None:
    """Were each corpus process to hang after its last line, the rule would fire on the runs
    that failed, and on no run that became ready, finished, or was still loading."""
    w, _ = make(hang_after_failure_s=120, stall_floor_s=3e7, waiting_s=None, silence_before_phase_s=3e7)
    for event in _corpus_events(path):
        w.observe(event, now=0.0)
    verdict = w.check(1e6).verdict
    if outcome in ("crashed", "oom"):
        assert verdict in (Verdict.CRASHED, Verdict.OOM)
    else:
        assert verdict == Verdict.HEALTHY, w.check(1e6).reason


# ---- exits ------------------------------------------------------------------------------


def test_exit_zero_is_done() -> None:
    w, _ = make()
    j = w.exited(0, None, killed_by_us=False)
    assert j == Judgement(Verdict.DONE, "exited 0", j.evidence)
    assert j.evidence.to_json()["returncode"] == 0 and "failure" not in j.evidence.to_json()


def test_exit_zero_after_a_recovered_failure_is_done_with_the_failure_kept() -> None:
    w, _ = make()
    w.observe(progress(1, 10, probe="extract.samples"))
    w.observe(failure(line="ValueError: retrying with a smaller batch"))
    w.observe(progress(2, 10, probe="extract.samples"))  # it made progress again: recovered
    j = w.exited(0, None, killed_by_us=False)
    assert j.verdict == Verdict.DONE and "recovered" in j.reason
    assert j.evidence.to_json()["line"] == "ValueError: retrying with a smaller batch"


def test_shutdown_lines_after_a_failure_are_no_recovery() -> None:
    # vLLM 0.23, TP=2, a worker SIGKILLed: the client still logs `[shutdown] MPClient: complete` (a
    # `done` phase line) on its way out, then exits 0.  The attempt crashed in the phase it was in.
    w, _ = make()
    w.observe(phase(Phase.ENGINE_READY))
    w.observe(failure(kind="other", line="Worker proc VllmWorker-1 died unexpectedly, shutting down executor."))
    w.observe(phase(Phase.DONE))
    j = w.exited(0, None, killed_by_us=False)
    assert j.verdict == Verdict.CRASHED, j.reason
    assert w.phase == Phase.ENGINE_READY


def test_exit_zero_right_after_a_failure_is_a_crash() -> None:
    # `vllm serve` with TP=2, one worker SIGKILLed: the engine dies and the server exits 0.
    w, _ = make()
    w.observe(phase(Phase.ENGINE_READY))
    w.observe(failure(kind="other", line="Worker proc VllmWorker-1 died unexpectedly, shutting down executor."))
    w.observe(failure(line="RuntimeError: Executor failed."))
    j = w.exited(0, None, killed_by_us=False)
    assert j.verdict == Verdict.CRASHED
    assert "VllmWorker-1 died unexpectedly" in j.reason


def test_nonzero_exit_after_a_failure_is_a_crash_with_evidence() -> None:
    w, _ = make()
    w.observe(phase(Phase.WEIGHT_LOADING))
    w.observe(failure(line="KeyError: 'model.layers.0.mlp.experts.w13_weight'", fp="ab12cd34ef56aa"))
    w.observe(failure(line="RuntimeError: Engine core initialization failed", fp="zz"))
    j = w.exited(1, None, killed_by_us=False)
    assert j.verdict == Verdict.CRASHED
    assert j.reason == "exited 1: KeyError: 'model.layers.0.mlp.experts.w13_weight'"
    ev = j.evidence.to_json()
    assert ev["fingerprint"] == "ab12cd34ef56aa"
    assert ev["returncode"] == 1 and ev["signal"] is None and ev["phase"] == "weight_loading"
    assert ev["failures_seen"] == 2
    assert ev["traceback_tail"].splitlines()[-1] == "KeyError: 'model.layers.0.mlp.experts.w13_weight'"
    assert len(ev["traceback_tail"].splitlines()) == 15
    assert w.check().verdict == Verdict.CRASHED  # final from now on
    assert w.next_check_at() is None


def test_nonzero_exit_without_a_failure_line_is_a_crash() -> None:
    w, _ = make()
    j = w.exited(3, None, killed_by_us=False)
    assert j.verdict == Verdict.CRASHED and "exited 3" in j.reason


def test_cuda_oom_then_death_is_oom() -> None:
    w, _ = make()
    w.observe(failure(kind=FailureKind.CUDA_OOM, line="torch.OutOfMemoryError: CUDA out of memory."))
    w.observe(failure(line="RuntimeError: worker died"))
    j = w.exited(1, None, killed_by_us=False)
    assert j.verdict == Verdict.OOM
    assert j.evidence.to_json()["failure"] == FailureKind.CUDA_OOM
    assert "CUDA out of memory" in j.evidence.to_json()["line"]


@pytest.mark.parametrize(("returncode", "signal"), [(None, 9), (137, None), (-9, None)])
def test_sigkill_we_did_not_send_is_killed_unless_the_kernel_says_oom(returncode: int | None, signal: int | None) -> None:
    w, _ = make()
    j = w.exited(returncode, signal, killed_by_us=False)
    assert j.verdict == Verdict.KILLED
    assert j.reason == "SIGKILL from outside the supervisor (the kernel reported no OOM kill)"
    assert j.evidence.to_json()["signal_name"] == "SIGKILL"


def test_sigkill_the_kernel_reports_as_an_oom_kill_is_oom() -> None:
    w, _ = make()
    j = w.exited(None, 9, killed_by_us=False, kernel_oom="cgroup memory.events: oom_kill 1")
    assert j.verdict == Verdict.OOM
    assert j.reason == "killed by the kernel's OOM killer: cgroup memory.events: oom_kill 1"
    assert j.evidence.to_json()["kernel"] == "cgroup memory.events: oom_kill 1"


def test_sigkill_we_sent_after_a_stall_keeps_the_stall_verdict() -> None:
    w, clock = make(stall_floor_s=5)
    advance(w, clock, 0, 0.0)
    stalled = w.check(10)
    assert stalled.verdict == Verdict.STALLED
    j = w.exited(None, 9, killed_by_us=True)
    assert j.verdict == Verdict.STALLED
    assert j.reason == stalled.reason
    assert j.evidence.to_json()["signal"] == 9


def test_a_stalled_process_we_stopped_that_exits_0_is_still_stalled() -> None:
    w, clock = make(stall_floor_s=5)
    advance(w, clock, 0, 0.0)
    assert w.check(10).verdict == Verdict.STALLED
    assert w.exited(0, None, killed_by_us=True).verdict == Verdict.STALLED


def test_a_stall_that_cleared_is_not_the_exit_verdict() -> None:
    w, clock = make(stall_floor_s=5)
    advance(w, clock, 0, 0.0)
    assert w.check(10).verdict == Verdict.STALLED
    advance(w, clock, 1, 11.0)
    assert w.check(11).verdict == Verdict.HEALTHY
    assert w.exited(None, 15, killed_by_us=True).verdict == Verdict.CRASHED


def test_killed_by_us_without_a_prior_verdict_is_reported_as_stopped() -> None:
    w, _ = make()
    j = w.exited(None, 15, killed_by_us=True)
    assert j.verdict == Verdict.CRASHED and "stopped by the supervisor" in j.reason


@pytest.mark.parametrize(("seconds", "text"), [(45, "45.0s"), (190, "3m10s"), (7500, "2h05m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# ---- replay of real pacing ----------------------------------------------------------------

_STALL_LOG = "vllm-0.23-6.7b-serve-stall-at-5of13"
_SHARD_BAR = re.compile(r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (\d+)/(\d+)")


def _pacing_file(name: str) -> Path:
    # The whole corpus may be copied under tests/data/corpus/; the pacing copy is always there.
    for folder in (DATA / "corpus" / "device-logs", DATA / "pacing"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(name)


def _arrivals() -> list[tuple[float, str]]:
    """(seconds since launch, record text) for every record, in arrival order."""
    out = []
    for line in _pacing_file(f"{_STALL_LOG}.arrivals.tsv").read_text(encoding="utf-8").splitlines():
        when, _, literal = line.partition("\t")
        if literal.startswith("#"):
            continue  # a note about the run (SIGSTOP/SIGCONT), not a record
        out.append((float(when), ast.literal_eval(literal)))
    return out


def _without_the_freeze(arrivals: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """The same run as if the EngineCore had never been stopped: a healthy paced load."""
    gap_start = next(t for t, text in arrivals if "5/13" in text)
    gap_end = next(t for t, text in arrivals if "6/13" in text)
    gap = gap_end - gap_start - 0.15  # keep the usual per-shard interval
    return [(t - gap if t >= gap_end else t, text) for t, text in arrivals]


def _replay(arrivals: list[tuple[float, str]], health: HealthSpec) -> list[tuple[float, Judgement]]:
    """Drive a watchdog the way the daemon does: check on every record and at next_check_at()."""
    clock = Clock()
    w = Watchdog(health, clock=clock)
    changes: list[tuple[float, Judgement]] = []

    def check(at: float) -> None:
        clock.t = at
        j = w.check()
        if not changes or changes[-1][1].verdict != j.verdict:
            changes.append((at, j))

    for when, text in arrivals:
        wake = w.next_check_at(now=clock.t)
        while wake is not None and wake <= when:
            check(wake)
            wake = w.next_check_at(now=wake)
        clock.t = when
        w.output_seen()
        match = _SHARD_BAR.search(text)
        if match:
            w.observe(phase(Phase.WEIGHT_LOADING))
            w.observe(progress(int(match[1]), int(match[2])))
        check(when)
    return changes


def test_replay_real_freeze_is_flagged_within_the_bound_and_clears() -> None:
    arrivals = _arrivals()
    froze_at = next(t for t, text in arrivals if "5/13" in text)
    resumed_at = next(t for t, text in arrivals if "6/13" in text)
    assert resumed_at - froze_at == pytest.approx(45.1, abs=0.2)
    changes = _replay(arrivals, HealthSpec(stall_floor_s=5))
    verdicts = [j.verdict for _, j in changes]
    assert verdicts == [Verdict.HEALTHY, Verdict.STALLED, Verdict.HEALTHY]
    flagged_at, stalled = changes[1]
    assert flagged_at - froze_at == pytest.approx(5.0, abs=1e-6)  # exactly at the bound
    assert stalled.evidence.to_json()["done"] == 5 and stalled.evidence.to_json()["total"] == 13
    assert stalled.evidence.to_json()["median_interval_s"] == pytest.approx(0.147, abs=0.01)
    assert stalled.reason.startswith("shard 5/13, no progress for 5.0s (bound 5.0s = stall_floor_s")
    assert changes[2][0] == resumed_at


def test_replay_real_freeze_is_flagged_with_a_tight_floor_within_3x_interval_or_floor() -> None:
    arrivals = _arrivals()
    froze_at = next(t for t, text in arrivals if "5/13" in text)
    changes = _replay(arrivals, HealthSpec(stall_floor_s=0.5))
    flagged_at = next(t for t, j in changes if j.verdict == Verdict.STALLED)
    assert flagged_at - froze_at <= max(0.5, 3 * 0.16) + 1e-6


def test_replay_real_freeze_is_not_flagged_with_the_default_floor() -> None:
    changes = _replay(_arrivals(), HealthSpec())
    assert [j.verdict for _, j in changes] == [Verdict.HEALTHY]


@pytest.mark.parametrize("floor", [0.5, 5.0, 60.0])
def test_replay_healthy_paced_load_is_never_flagged(floor: float) -> None:
    changes = _replay(_without_the_freeze(_arrivals()), HealthSpec(stall_floor_s=floor))
    assert [j.verdict for _, j in changes] == [Verdict.HEALTHY]


# ---- errors the program survives ----------------------------------------------------------

def serving(status: int = 200) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.INFO, message=f'"POST /v1/chat/completions HTTP/1.1" {status}',
                 probe="uvicorn.access", phase=Phase.RUNNING, data={"serving": True, "status": status})


def _ready_server(w: Watchdog) -> None:
    for p in (Phase.WEIGHT_LOADING, Phase.ENGINE_READY):
        w.observe(phase(p))
    w.observe(serving())


def test_a_ready_server_that_answers_after_an_error_logged_call_is_done_at_exit() -> None:
    # vLLM 0.22 sleep mode: one wake_up fails with an ERROR-logged CUDA OOM; requests go on 200 OK.
    w, _ = make()
    _ready_server(w)
    w.observe(failure("runtime_error", "RuntimeError: CUDA Error: out of memory", level="ERROR"))
    w.observe(serving(500))  # that call's own answer: no sign of recovery
    w.observe(serving(200))
    assert w.exited(0, None, killed_by_us=False).verdict is Verdict.DONE


def test_an_error_with_no_request_answered_after_it_is_still_a_crash_at_exit_0() -> None:
    w, _ = make()
    _ready_server(w)
    w.observe(failure("runtime_error", "RuntimeError: engine died", level="ERROR"))
    w.observe(serving(500))
    assert w.exited(0, None, killed_by_us=False).verdict is Verdict.CRASHED


def test_a_trainer_that_steps_on_after_a_killed_dataloader_worker_is_done() -> None:
    w, clock = make()
    w.observe(phase(Phase.RUNNING))
    advance(w, clock, 1, 1.0, total=10)
    w.observe(failure("runtime_error", "RuntimeError: DataLoader worker (pid 563735) is killed by signal: Killed."))
    for i in range(2, 11):
        advance(w, clock, i, float(i), total=10)
    assert w.exited(0, None, killed_by_us=False).verdict is Verdict.DONE


def test_a_fatal_failure_is_fatal_whatever_follows() -> None:
    w, _ = make()
    _ready_server(w)
    line = "EngineDeadError: EngineCore encountered an issue."
    w.observe(Event(job="j", attempt=1, kind=EventKind.FAILURE, message=line, probe="vllm.engine_dead",
                    failure=Failure(FailureKind.OTHER, line, "fp", None, None, fatal=True)))
    w.observe(serving(200))
    assert w.exited(0, None, killed_by_us=False).verdict is Verdict.CRASHED


@pytest.mark.parametrize("how", [{"returncode": None, "signal": 15}, {"returncode": 143, "signal": None},
                                 {"returncode": -2, "signal": None}])
def test_a_requested_shutdown_after_ready_is_done(how: dict[str, Any]) -> None:
    w, _ = make()
    _ready_server(w)
    judgement = w.exited(how["returncode"], how["signal"], killed_by_us=False)
    assert judgement.verdict is Verdict.DONE and "requested shutdown" in judgement.reason


def test_sigterm_before_ready_is_still_a_crash() -> None:
    w, _ = make()
    w.observe(phase(Phase.WEIGHT_LOADING))
    assert w.exited(None, 15, killed_by_us=False).verdict is Verdict.CRASHED


def test_a_failure_before_any_phase_is_at_start_up_but_judged_as_before_any_phase() -> None:
    """A failure logged before the program said anything of itself puts it at `startup` (what status and probe
    show), but nothing is known of it: the start-up waiting rule stays off, and silence is bounded by the limit
    for a program before any phase, not by a phase's."""
    w, clock = make(silence_before_phase_s=100, waiting_s=10, hang_after_failure_s=None)
    w.observe(failure(line="ValueError: Tokenizer not available", level="WARNING"))
    assert w.phase is Phase.STARTUP
    clock.t = 50.0
    assert w.check().verdict == Verdict.HEALTHY  # waiting_s (10 s) is for a program in a named start-up phase
    clock.t = 101.0
    judged = w.check()
    assert judged.verdict == Verdict.SILENT and "before any phase (limit 1m40s)" in judged.reason
    named, clock = make(silence_before_phase_s=100, waiting_s=10, hang_after_failure_s=None)
    named.observe(phase(Phase.MODEL_INIT))
    clock.t = 11.0
    assert named.check().verdict == Verdict.STALLED  # the rule itself still holds where the phase is named


def test_max_runtime_is_a_timeout_from_the_attempts_start_however_healthy_it_is() -> None:
    clock = Clock(1000.0)
    # A re-adopted attempt: started 100 s before this watchdog was made.
    dog = Watchdog(HealthSpec(), clock=clock, started_at=900.0, max_runtime_s=7200.0)
    dog.observe(phase(Phase.WEIGHT_LOADING))
    for step in range(1, 200):
        clock.t = 900.0 + step * 36.0  # a bar step every 36 s: never stalled, never silent
        dog.observe(progress(step, 10_000))
        dog.output_seen()
    clock.t = 8099.9
    assert dog.check().verdict == Verdict.HEALTHY
    assert dog.next_check_at() == 8100.0 and dog.upcoming()[:2] == (8100.0, Verdict.TIMEOUT)
    clock.t = 8100.0
    judged = dog.check()
    assert judged.verdict == Verdict.TIMEOUT and judged.reason == "ran past max_runtime 2h00m", judged
    assert judged.evidence.to_json()["max_runtime_s"] == 7200.0
    # Killed for it: the verdict stays, however the process then ended.
    assert dog.exited(None, 15, killed_by_us=True).verdict == Verdict.TIMEOUT


def test_no_max_runtime_no_time_limit() -> None:
    clock = Clock(0.0)
    dog = Watchdog(HealthSpec(silence_before_phase_s=10 ** 7), clock=clock)
    clock.t = 9 * 10 ** 6  # 104 days: no rule but the (lifted) silence one could end it
    assert dog.check().verdict == Verdict.HEALTHY
    upcoming = dog.upcoming()
    assert upcoming is None or upcoming[1] != Verdict.TIMEOUT
