"""vLLM's engine dead while its process goes on: ``Engine iteration timed out`` (serving with
VLLM_ENGINE_ITERATION_TIMEOUT_S), AsyncEngineDeadError, MQLLMEngine's and V1's EngineDeadError.

Every line is real: tests/data/engine_dead/ holds excerpts of logs pasted in public issues (its
README cites each).  The probes mark these failures ``fatal``; the watchdog then judges a ready
server that goes on answering requests as crashed once ``hang_after_failure_s`` has passed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_helpers import events_of as events_of_text

from supervisor.core.errors import ProbePackError
from supervisor.core.events import Event, EventKind, FailureKind, Phase, ProbeEvent, Verdict
from supervisor.core.records import split_records
from supervisor.probes import ProbeEngine, load_packs
from supervisor.probes._pack import parse_pack
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog

DATA = Path(__file__).parent / "data" / "engine_dead"
PACKS = load_packs()

# file -> (the fatal probes that must fire, the root cause's kind)
EXPECTED = {
    "v0-iteration-timeout.log": ({"vllm.iteration_timeout", "vllm.engine_loop_failed"}, FailureKind.DISTRIBUTED_TIMEOUT),
    "v0-iteration-timeout-metrics.log": ({"vllm.iteration_timeout", "vllm.engine_loop_failed"},
                                         FailureKind.DISTRIBUTED_TIMEOUT),
    "v0.9-iteration-timeout-bracketed.log": ({"vllm.iteration_timeout", "vllm.engine_loop_failed"},
                                             FailureKind.DISTRIBUTED_TIMEOUT),
    "mq-engine-dead-server-answers.log": ({"vllm.mq_engine_dead"}, None),
    "v1-engine-dead-server-answers.log": ({"vllm.engine_died", "vllm.engine_dead"}, None),
    # Read as a traceback (its frames came first): its final line makes it fatal.
    "v1-engine-dead-error.log": ({"python.traceback"}, None),
    "v1-engine-dead-500.log": ({"vllm.engine_dead"}, None),
}


def events_of(path: Path) -> list[ProbeEvent]:
    return events_of_text(path.read_bytes())


def as_event(pe: ProbeEvent) -> Event:
    return Event(job="j", attempt=1, kind=EventKind(pe.kind.value), message=pe.line, probe=pe.probe,
                 phase=pe.phase, data=pe.fields, failure=pe.failure)


def test_every_excerpt_is_expected() -> None:
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_engine_dead_lines_are_fatal_failures(name: str) -> None:
    probes, root_kind = EXPECTED[name]
    events = events_of(DATA / name)
    fatal = {e.probe for e in events if e.failure is not None and e.failure.fatal}
    assert probes <= fatal, f"{name}: fatal probes {fatal}"
    watchdog = Watchdog(HealthSpec(), clock=lambda: 0.0)
    for event in events:
        watchdog.observe(as_event(event))
    if root_kind is not None:  # the timeout itself, never its echoes, is the attempt's failure
        assert watchdog.failure is not None and watchdog.failure.kind is root_kind
        assert "Engine iteration timed out" in watchdog.failure.line


def test_a_traceback_ending_in_engine_dead_error_is_fatal() -> None:
    # The MQ client's traceback ends "RuntimeError: Engine loop has died": caught as a traceback.
    events = events_of(DATA / "mq-engine-dead-server-answers.log")
    tracebacks = [e for e in events if e.failure is not None and e.failure.traceback]
    assert tracebacks and all(e.failure is not None and e.failure.fatal for e in tracebacks)


def ready_watchdog(clock: list[float], health: HealthSpec) -> Watchdog:
    watchdog = Watchdog(health, clock=lambda: clock[0])
    watchdog.observe(Event(job="j", attempt=1, kind=EventKind.PHASE, message="Available routes are:",
                           phase=Phase.ENGINE_READY))
    return watchdog


@pytest.mark.parametrize("name", ["mq-engine-dead-server-answers.log", "v1-engine-dead-500.log",
                                  "v0-iteration-timeout.log"])
def test_a_ready_server_answering_with_its_engine_dead_is_crashed(name: str) -> None:
    clock = [0.0]
    watchdog = ready_watchdog(clock, HealthSpec(hang_after_failure_s=60))
    for event in events_of(DATA / name):
        watchdog.observe(as_event(event))
    # The API server goes on answering (access-log lines every few seconds): output, not progress.
    for at in range(5, 60, 5):
        clock[0] = float(at)
        watchdog.output_seen()
        assert watchdog.check().verdict is Verdict.HEALTHY
    clock[0] = 60.0
    watchdog.output_seen()
    judgement = watchdog.check()
    assert judgement.verdict is Verdict.CRASHED, judgement.reason
    assert "after a fatal failure" in judgement.reason


def test_a_ready_server_with_one_failed_request_is_not_judged() -> None:
    # A request's own error (not the engine's death) in a ready server: no verdict, however long.
    clock = [0.0]
    watchdog = ready_watchdog(clock, HealthSpec(hang_after_failure_s=60))
    line = ("(APIServer pid=1) ERROR 10-20 03:20:50 [serving_chat.py:1136] Error in chat completion stream "
            "generator.")
    records, _ = split_records((line + "\n").encode(), 0, final=True)
    engine = ProbeEngine(PACKS)
    for event in engine.feed_many(records) + engine.flush():
        watchdog.observe(as_event(event))
    clock[0] = 600.0
    assert watchdog.check().verdict is Verdict.HEALTHY


def test_fatal_is_for_failure_probes_only() -> None:
    with pytest.raises(ProbePackError, match="'fatal' is only for probes of kind 'failure'"):
        parse_pack({"name": "p", "probes": [{"id": "x", "kind": "info", "regex": "a", "fatal": True}]}, "p.toml")
    pack = parse_pack({"name": "p", "probes": [{"id": "x", "kind": "failure", "failure": "other", "regex": "a",
                                                "fatal": True}]}, "p.toml")
    assert pack.probes[0].fatal
