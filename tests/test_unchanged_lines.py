"""Lines that change nothing cost nothing of their own: a plain info line the watchdog already
took at the same time (a vLLM server's access log, one line per request) is not fed to it again,
and past the event cap no event is made of it (runner/_watching.py ``_observe``).  The watchdog
says when an event changed nothing (``Watchdog.observe``); skipping the repeats judges alike."""

from __future__ import annotations

from supervisor.core.events import EventKind, Failure, FailureKind, Phase, ProbeEvent, ProbeKind
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.runner._watching import _from_probe
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog import Watchdog

_ACCESS = {"serving": True, "client": "127.0.0.1", "method": "POST", "path": "/v1/completions", "status": 200}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _access(n: int, status: int = 200) -> ProbeEvent:
    return ProbeEvent(ProbeKind.INFO, "uvicorn.access", n * 80,
                      f'INFO:     127.0.0.1:{40000 + n} - "POST /v1/completions HTTP/1.1" {status} OK',
                      phase=Phase.RUNNING, fields={**_ACCESS, "status": status})


def _watchdog() -> tuple[Watchdog, _Clock]:
    clock = _Clock()
    return Watchdog(HealthSpec(), clock=clock, started_at=0.0), clock


def test_an_access_log_line_again_at_the_same_time_changes_nothing() -> None:
    wd, _ = _watchdog()
    assert wd.observe(_from_probe("j", 1, _access(0)), 10.0) is True  # the server enters `running`
    assert wd.observe(_from_probe("j", 1, _access(1)), 10.0) is False  # the same request line again
    assert wd.observe(_from_probe("j", 1, _access(2)), 10.0) is False
    assert wd.observe(_from_probe("j", 1, _access(3)), 11.0) is True  # later: the server is active later
    assert wd.observe(_from_probe("j", 1, _access(4)), 11.0) is False


def test_events_that_move_the_watchdog_say_so_every_time() -> None:
    wd, _ = _watchdog()
    wd.observe(_from_probe("j", 1, _access(0)), 10.0)
    heartbeat = ProbeEvent(ProbeKind.INFO, "vllm.waiting", 0, "still waiting", fields={"heartbeat": True})
    metric = ProbeEvent(ProbeKind.METRIC, "transformers.loss", 0, "{'loss': 1.0}", fields={"loss": 1.0})
    failure = ProbeEvent(ProbeKind.FAILURE, "python.error", 0, "ValueError: x",
                         failure=Failure(FailureKind.OTHER, "ValueError: x"))
    for pe in (heartbeat, heartbeat, metric, metric, failure, failure):
        assert wd.observe(_from_probe("j", 1, pe), 10.0) is True, pe
    # A request answered after a failure shows the server going on: a change, once.
    assert wd.observe(_from_probe("j", 1, _access(1)), 10.0) is True
    assert wd.observe(_from_probe("j", 1, _access(2)), 10.0) is False


def _skipped(wd: Watchdog, pe: ProbeEvent, at: float) -> bool:
    """The runner's rule (``_observe``): a plain info line the watchdog says would change nothing."""
    return pe.kind is ProbeKind.INFO and pe.failure is None and wd.unchanged_by(pe.probe, pe.phase, pe.fields, at)


def test_the_same_info_line_is_told_by_what_the_watchdog_reads() -> None:
    wd, _ = _watchdog()
    wd.observe(_from_probe("j", 1, _access(4)), 10.0)
    wd.observe(_from_probe("j", 1, _access(4)), 10.0)  # the second changed nothing: remembered as such
    assert _skipped(wd, _access(5), 10.0)  # another client port: the same to the watchdog
    assert not _skipped(wd, _access(5, status=500), 10.0)  # a failed request is not
    assert not _skipped(wd, _access(5), 11.0)  # a later time is news: the output's time moves
    waiting = ProbeEvent(ProbeKind.INFO, "vllm.waiting", 0, "still waiting", fields={"heartbeat": True})
    assert not _skipped(wd, waiting, 10.0)  # a heartbeat's text is what the watchdog keeps
    metric = ProbeEvent(ProbeKind.METRIC, "m", 0, "x", fields={"loss": 1.0})
    assert not _skipped(wd, metric, 10.0)  # a metric is a point of a series


def test_feeding_only_the_lines_that_change_something_judges_alike() -> None:
    """The runner's rule (skip a line the watchdog says would change nothing, in any read)
    against feeding every line, over reads of access-log lines with a failure, failed
    requests and a quiet spell between: the same state and verdicts at every step."""
    reads: list[tuple[float, list[ProbeEvent]]] = []
    for r in range(40):
        batch = [_access(r * 50 + i, status=500 if (r, i) in {(7, 3), (21, 0)} else 200) for i in range(50)]
        if r == 12:
            batch.insert(10, ProbeEvent(ProbeKind.FAILURE, "python.error", 0, "RuntimeError: boom",
                                        failure=Failure(FailureKind.OTHER, "RuntimeError: boom")))
        reads.append((10.0 + r * 0.5 + (30.0 if r >= 30 else 0.0), batch))  # a quiet spell of 30 s before read 30
    every, _ = _watchdog()
    some, _ = _watchdog()
    fed = 0
    for at, batch in reads:
        for pe in batch:
            every.observe(_from_probe("j", 1, pe), at)
        for pe in batch:
            if _skipped(some, pe, at):
                continue
            fed += 1
            some.observe(_from_probe("j", 1, pe), at)
        for probe_at in (at, at + 60.0, at + 4000.0):
            assert every.state(probe_at) == some.state(probe_at)
            assert every.check(probe_at) == some.check(probe_at)
    assert fed < sum(len(b) for _, b in reads) / 10  # most lines were never fed


def test_a_line_counted_past_the_cap_without_an_event_is_dropped_as_admit_would() -> None:
    counted, admitted = EventCap(limit=100, stored=100), EventCap(limit=100, stored=100)
    counted.drop()
    assert admitted.admits(_from_probe("j", 1, _access(0))) is False
    assert counted.dropped == admitted.dropped == 1 and counted.notice() == admitted.notice()
    assert _from_probe("j", 1, _access(0)).kind is EventKind.INFO
