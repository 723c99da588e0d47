"""The watchdog makes its rules' conditions once per change of the facts and reuses them for every
question until the next event.  Whatever arrives, in whatever order, each answer must be the one
conditions made anew would give: a stale list would judge a job on facts it no longer has."""

from __future__ import annotations

import random
from typing import Any

from supervisor.core.events import Event, EventKind, Failure, FailureKind, Phase
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog
from supervisor.watchdog._pace import BarPace, PaceHistory


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _event(rng: random.Random, done: dict[str, int]) -> Event:
    roll = rng.random()
    if roll < 0.55:
        bar = rng.choice(["vllm.shards", "training.step"])
        done[bar] += rng.choice([0, 1, 1, 2])
        return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="bar", probe=bar,
                     data={"done": done[bar], "total": 64})
    if roll < 0.7:
        p = rng.choice(list(Phase))
        return Event(job="j", attempt=1, kind=EventKind.PHASE, message=p.value, phase=p, probe="vllm.phase")
    if roll < 0.8:
        return Event(job="j", attempt=1, kind=EventKind.METRIC, message="loss", probe="training.loss",
                     data={"loss": rng.choice([1.0, 0.5, 2.0, float("nan")])})
    if roll < 0.9:
        return Event(job="j", attempt=1, kind=EventKind.INFO, message="waiting", data={"heartbeat": True})
    line = rng.choice(["RuntimeError: boom", "torch.OutOfMemoryError: CUDA out of memory"])
    kind = FailureKind.CUDA_OOM if "memory" in line else FailureKind.RUNTIME_ERROR
    return Event(job="j", attempt=1, kind=EventKind.FAILURE, message=line, probe="python.traceback",
                 failure=Failure(kind, line, line[:8], None, None))


def _answers(w: Watchdog, at: float) -> tuple[Any, ...]:
    judged = w.check(at)
    return (w.next_check_at(at), judged.verdict, judged.reason, w.upcoming(at),
            [(key, j.verdict, j.reason) for key, j in w.slow(at)], w.stall_bounds(at))


def test_reused_conditions_answer_as_conditions_made_anew() -> None:
    health = HealthSpec(first_progress_s={Phase.WEIGHT_LOADING: 30.0}, phase_deadline_s={Phase.CUDA_GRAPH_CAPTURE: 50.0},
                        silence_s=20.0, hang_after_failure_s=15.0, diverge_k=3)
    for seed in range(40):
        rng = random.Random(seed)
        cached_clock, fresh_clock = Clock(), Clock()
        # Earlier attempts' paces for one bar: its stall bound comes from history, and its slow
        # steps are reported.
        history = PaceHistory({"vllm.shards": BarPace("vllm.shards", tuple(sorted(rng.uniform(1, 4) for _ in range(40))), 2)})
        cached = Watchdog(health, clock=cached_clock, history=history)
        fresh = Watchdog(health, clock=fresh_clock, history=history)
        done_a = {"vllm.shards": 0, "training.step": 0}
        done_b = dict(done_a)
        at = 0.0
        for _ in range(120):
            at += rng.choice([0.1, 1.0, 5.0, 12.0, 40.0])
            cached_clock.t = fresh_clock.t = at
            action = rng.random()
            if action < 0.6:
                state = rng.getstate()
                cached.observe(_event(rng, done_a), at)
                rng.setstate(state)
                fresh.observe(_event(rng, done_b), at)
            elif action < 0.75:
                cached.output_seen(at)
                fresh.output_seen(at)
            elif action < 0.85:
                busy = rng.random() < 0.5
                cached.gpus_sampled((0,), busy, at)
                fresh.gpus_sampled((0,), busy, at)
            # Several questions between events: the cached one reuses its list, the fresh one
            # is made to build it anew for each.
            for later in (at, at + 3.0, at + 30.0):
                fresh._made = None
                expected = _answers(fresh, later)
                assert _answers(cached, later) == expected, (seed, at, later)
