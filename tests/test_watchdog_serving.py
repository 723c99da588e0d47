"""A hung serving engine and a diverging loss: the watchdog's rules on a fake clock, real log
lines read by the real packs, and the gate's per-verdict default (warn, never a kill)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from supervisor.core.events import Event, EventKind, Phase, Verdict
from supervisor.core.records import Record
from supervisor.jobs.runner._verdict import KillGate, Step
from supervisor.probes import ProbeEngine, load_packs
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(**health: Any) -> tuple[Watchdog, Clock]:
    clock = Clock()
    return Watchdog(HealthSpec(**health), clock=clock), clock


def metric(**data: Any) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.METRIC, message="m", probe="vllm.throughput", phase=Phase.RUNNING,
                 data=data)


def step(n: int, loss: Any) -> Event:
    return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message=f"step {n}", probe="training.step",
                 data={"done": n, "total": 10_000, "loss": loss})


def events_of(lines: list[str]) -> list[Event]:
    engine = ProbeEngine(load_packs(None))
    offset, found = 0, []
    for text in lines:
        record = Record(text, offset, offset + len(text) + 1)
        offset = record.end
        found += engine.feed(record)
    found += engine.flush()
    return [Event(job="j", attempt=1, kind=EventKind(e.kind.value), message=e.line, probe=e.probe, phase=e.phase,
                  data=dict(e.fields)) for e in found]


# ---- a hung engine -------------------------------------------------------------------------

def test_zero_throughput_with_requests_waiting_for_hung_s_is_hung() -> None:
    w, clock = make(hung_s=60)
    for t in range(0, 60, 10):  # vLLM prints its throughput line every 10 s
        clock.t = t
        w.observe(metric(prompt_tps=0.0, gen_tps=0.0, running=4, waiting=12))
        assert w.check().verdict is Verdict.HEALTHY, t
    clock.t = 60.0
    judged = w.check()
    assert judged.verdict is Verdict.HUNG
    assert "0 tokens/s with 4 running and 12 waiting" in judged.reason and judged.evidence.to_json()["stuck_s"] == 60.0


def test_throughput_again_or_nothing_to_do_ends_it_and_an_idle_server_is_never_hung() -> None:
    w, clock = make(hung_s=60)
    w.observe(metric(prompt_tps=0.0, gen_tps=0.0, running=1, waiting=0))
    clock.t = 50
    w.observe(metric(prompt_tps=12.0, gen_tps=80.5, running=1, waiting=0))  # it moved
    clock.t = 100
    assert w.check().verdict is Verdict.HEALTHY
    w.observe(metric(prompt_tps=0.0, gen_tps=0.0, running=0, waiting=0))  # idle: nothing asked of it
    clock.t = 10_000
    assert w.check().verdict is Verdict.HEALTHY and w.next_check_at() is None


def test_hung_s_none_turns_the_rule_off() -> None:
    w, clock = make(hung_s=None)
    w.observe(metric(prompt_tps=0.0, gen_tps=0.0, running=3, waiting=3))
    clock.t = 1e6
    assert w.check().verdict is Verdict.HEALTHY


@pytest.mark.parametrize("line", [
    # vLLM V1 (0.11 format), V0 (0.6 format), SGLang's decode batch
    "INFO 12-03 10:00:10 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
    "0.0 tokens/s, Running: 2 reqs, Waiting: 7 reqs, GPU KV cache usage: 99.2%, Prefix cache hit rate: 0.0%",
    "INFO 12-03 10:00:10 metrics.py:455] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
    "Running: 2 reqs, Swapped: 0 reqs, Pending: 7 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 0.0%.",
    "[2026-12-03 10:00:10 TP0] Decode batch. #running-req: 2, #token: 5000, token usage: 0.99, gen throughput "
    "(token/s): 0.00, #queue-req: 7, ",
])
def test_real_throughput_lines_read_by_the_packs_make_a_hung_engine(line: str) -> None:
    events = [e for e in events_of([line]) if e.kind is EventKind.METRIC]
    assert events, line
    w, clock = make(hung_s=30)
    for t in (0, 10, 20, 30):
        clock.t = t
        for event in events:
            w.observe(event)
    judged = w.check()
    assert judged.verdict is Verdict.HUNG and "2 running and 7 waiting" in judged.reason, judged


# ---- a diverging loss ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", float("nan"), "-inf"])
def test_a_non_finite_loss_is_diverged_at_once(value: Any) -> None:
    w, clock = make()
    for n in range(1, 5):
        clock.t = n
        w.observe(step(n, 2.0 - n * 0.1))
    assert w.check().verdict is Verdict.HEALTHY
    w.observe(step(5, value))
    judged = w.check()
    assert judged.verdict is Verdict.DIVERGED and "loss is" in judged.reason


def test_a_loss_over_k_times_its_median_for_n_readings_in_a_row_is_diverged_one_spike_is_not() -> None:
    w, clock = make(diverge_k=5, diverge_steps=4)
    n = 0
    for _ in range(10):
        n += 1
        clock.t = n
        w.observe(step(n, 1.0))
    for loss in (9.0, 9.0, 9.0, 0.9):  # three spikes, then back: not diverged
        n += 1
        clock.t = n
        w.observe(step(n, loss))
        assert w.check().verdict is Verdict.HEALTHY
    for i in range(4):
        n += 1
        clock.t = n
        w.observe(step(n, 50.0 + i))
        verdict = w.check().verdict
        assert verdict is (Verdict.DIVERGED if i == 3 else Verdict.HEALTHY), (i, verdict)
    assert "for 4 readings in a row" in w.check().reason


def test_a_loss_read_from_real_trainer_lines() -> None:
    lines = [f"{{'loss': {1.0 - i * 0.01:.4f}, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.{i}}}" for i in range(10)]
    lines.append("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.99}")
    w, clock = make()
    for t, event in enumerate(events_of(lines)):
        clock.t = t
        w.observe(event)
    assert w.check().verdict is Verdict.DIVERGED


# ---- the gate: warned by default, killed where the spec says so -----------------------------

@pytest.mark.parametrize("verdict,field", [(Verdict.HUNG, "hung_action"), (Verdict.DIVERGED, "diverge_action")])
def test_hung_and_diverged_are_warned_about_by_default_and_killed_only_where_asked(verdict: Verdict, field: str) -> None:
    from supervisor.watchdog import Judgement

    judged = Judgement(verdict, "x")
    warn = KillGate.of(HealthSpec())
    assert warn.judge(judged, 0.0) is Step.WARN and warn.judge(judged, 1e9) is Step.NOTHING
    assert f"health.{field} is \"warn\"" in warn.next_action("j", 0.0)
    assert KillGate.of(HealthSpec(**{field: "kill"})).judge(judged, 0.0) is Step.KILL
    # The job's own action still governs the other verdicts.
    assert KillGate.of(HealthSpec()).judge(Judgement(Verdict.STALLED, "s"), 0.0) is Step.KILL


@pytest.mark.parametrize("fields", [
    {"hung_s": 0}, {"hung_s": -5}, {"hung_s": "soon"}, {"diverge_k": 1}, {"diverge_k": float("inf")},
    {"diverge_steps": 0}, {"diverge_steps": 1.5}, {"hung_action": "explode"}, {"diverge_action": ""},
    {"idle_s": -1}, {"idle_s": float("nan")}, {"idle_action": "sleep"},
])
def test_bad_values_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        HealthSpec(**fields)


def test_a_rule_due_the_moment_its_event_came_asks_for_a_look_now_once() -> None:
    """The daemon sleeps until next_check_at(): a NaN loss must wake it at once, not at the
    next deadline of some other rule (or never)."""
    w, clock = make()
    clock.t = 5.0
    w.observe(step(1, "nan"))
    assert w.next_check_at() == 5.0
    assert w.check().verdict is Verdict.DIVERGED
    assert w.next_check_at() != 5.0  # said once: no busy loop while it is warned about


# ---- idle GPUs ------------------------------------------------------------------------------

def test_gpus_at_zero_utilisation_with_no_progress_for_idle_s_is_idle_and_progress_or_work_resets_it() -> None:
    w, clock = make(idle_s=100, stall_floor_s=1000)
    for t in range(0, 100, 10):
        clock.t = t
        w.gpus_sampled((0, 1), busy=False)
    clock.t = 99
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 100
    judged = w.check()
    assert judged.verdict is Verdict.IDLE and "GPU 0, 1 at 0% utilisation and no progress for" in judged.reason
    clock.t = 101
    w.observe(step(1, 1.0))  # a step: it moved
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 150
    w.gpus_sampled((0,), busy=True)  # it computes again
    clock.t = 240
    assert w.check().verdict is Verdict.HEALTHY
    clock.t = 250
    assert w.check().verdict is Verdict.IDLE


def test_never_seen_on_a_gpu_an_idle_server_and_idle_s_none_are_never_idle() -> None:
    w, clock = make(idle_s=10)
    clock.t = 1000
    assert w.check().verdict is not Verdict.IDLE  # no sample showed it on a GPU
    server, clock = make(idle_s=10)
    server.gpus_sampled((0,), busy=False)
    server.observe(metric(prompt_tps=0.0, gen_tps=0.0, running=0, waiting=0))
    clock.t = 1000
    assert server.check().verdict is Verdict.HEALTHY  # a server with nothing asked of it
    off, clock = make(idle_s=None)
    off.gpus_sampled((0,), busy=False)
    clock.t = 1e6
    assert off.check().verdict is not Verdict.IDLE


def test_idle_is_warned_about_by_default() -> None:
    from supervisor.watchdog import Judgement

    gate = KillGate.of(HealthSpec())
    assert gate.judge(Judgement(Verdict.IDLE, "x"), 0.0) is Step.WARN
    assert 'health.idle_action is "warn"' in gate.next_action("j", 0.0)


def test_megatron_iteration_lines_are_progress_with_their_loss_and_a_nan_loss_diverges() -> None:
    line = (" iteration {i:>8}/  500000 | consumed samples: {s:>12} | elapsed time per iteration (ms): 1408.2 | "
            "learning rate: 9.375E-08 | global batch size:    32 | lm loss: {loss} | loss scale: 1.0 | grad norm: "
            "3.094 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    lines = [line.format(i=i, s=32 * i, loss=f"{3.0 - i * 0.01:.6E}") for i in range(1, 11)]
    events = events_of(lines)
    steps = [e for e in events if e.kind is EventKind.PROGRESS and e.probe == "megatron.iteration"]
    assert [e.data["done"] for e in steps] == list(range(1, 11)) and steps[0].data["total"] == 500000
    assert steps[0].data["loss"] == pytest.approx(2.99)
    w, clock = make()
    for t, event in enumerate(events_of([*lines, line.format(i=11, s=352, loss="nan")])):
        clock.t = t
        w.observe(event)
    assert w.check().verdict is Verdict.DIVERGED
