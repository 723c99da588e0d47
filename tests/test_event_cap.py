"""The per-attempt event cap (event_cap.py): past it an attempt's bulk lines are not stored, its
bars' latest counts, phases and failures still are, and one action event says so."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

from supervisor.core.events import Event, EventKind
from supervisor.jobs.event_cap import EventCap


def _event(kind: EventKind, n: int) -> Event:
    return Event(job="j", attempt=1, kind=kind, message=f"line {n}", data={})


def test_the_cap_drops_bulk_kinds_only_and_says_so_once() -> None:
    cap = EventCap(limit=3)
    assert cap.admit([_event(EventKind.METRIC, n) for n in range(3)]) and cap.notice() is None  # not past it
    late = [_event(EventKind.METRIC, 3), _event(EventKind.FAILURE, 4), _event(EventKind.PROGRESS, 5),
            _event(EventKind.PHASE, 6), _event(EventKind.INFO, 7)]
    assert [e.kind for e in cap.admit(late)] == [EventKind.FAILURE, EventKind.PHASE]
    assert cap.dropped == 3
    notice = cap.notice()
    assert notice is not None and "events_per_attempt" in notice
    cap.admit([_event(EventKind.METRIC, 8)])
    assert cap.notice() is None and cap.dropped == 4  # said once


def test_a_cap_reached_before_a_restart_is_not_said_again() -> None:
    cap = EventCap(limit=3, stored=5)
    assert cap.admit([_event(EventKind.METRIC, 0)]) == [] and cap.notice() is None


# 1000 steps of a bar (101 milestones: more than the cap of 100), then a crash.
BAR_THEN_CRASH = """\
import sys
for i in range(0, 1001):
    print(f"train: {i//10}%|###| {i}/1000 [00:00<00:01, 5.0it/s]", flush=True)
raise KeyError("layers.0.weight_scale")
"""


def test_an_attempt_past_its_cap_keeps_its_bars_end_and_its_failure(home: Path, daemon_env, make_job,
                                                                   monkeypatch) -> None:
    (home / "config.toml").write_text("events_per_attempt = 100\n")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        spec = make_job("capped", BAR_THEN_CRASH)
        client.start(str(spec), {})
        wait_until(lambda: job_state(client, "capped") in {"failed", "backoff"}, timeout=60)
        events = client.events("capped", attempt=1).events
        progress = [int(e.data["done"]) for e in events if e.kind == "progress"]
        # The cap (100 log events) and the bar's latest row, in place: its true end is kept.
        assert len(progress) <= 101 and progress[-1] == 1000, progress
        said = [e for e in events if e.kind == "action" and "events_per_attempt" in e.message]
        assert len(said) == 1, [(e.kind, e.message) for e in events if e.kind not in ("progress",)]
        assert any(e.kind == "failure" and "weight_scale" in e.message for e in events), events[-5:]
    finally:
        daemon.close()


# tqdm over files: a one-step bar per file, 20,000 of them, then the job ends.
ONE_STEP_BARS = """\
import sys
for n in range(20_000):
    sys.stderr.write("files:   0%|          | 0/1 [00:00<?, ?it/s]\\r")
    sys.stderr.write(f"files: 100%|##########| 1/1 [00:00<00:00, {n}.0it/s]\\n")
sys.stderr.flush()
"""


def test_distinct_bars_past_the_cap_store_a_bounded_number_of_rows(home: Path, daemon_env, make_job,
                                                                  monkeypatch) -> None:
    (home / "config.toml").write_text("events_per_attempt = 1000\n")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        client.start(str(make_job("files", ONE_STEP_BARS)), {})
        wait_until(lambda: job_state(client, "files") == "done", timeout=120)
        progress = []
        after = None
        while True:  # every stored row, 10,000 a call
            page = client.events("files", attempt=1, kinds=["progress"], after=after).events
            if not page:
                break
            progress += page
            after = page[-1].id
        # The cap (1,000 log events), and past it the newest bars' stand-ins (64): not one row per bar.
        assert len(progress) <= 1000 + 64, len(progress)
        assert progress[-1].data["done"] == 1  # the last bar's end is kept
    finally:
        daemon.close()


# A vLLM server's access log: one info line per request, 3,000 of them in bursts (many to a read),
# then a failed request and a traceback-free end.
ACCESS_LOG = """\
import sys, time
out = sys.stdout
out.write("INFO:     Application startup complete.\\n")
for burst in range(30):
    out.write("".join(f'INFO:     127.0.0.1:{40000 + burst * 100 + i} - "POST /v1/completions HTTP/1.1" 200 OK\\n'
                      for i in range(100)))
    out.flush()
    time.sleep(0.02)
out.write('INFO:     127.0.0.1:39999 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\\n')
out.flush()
"""


def test_access_log_lines_past_the_cap_are_counted_and_not_stored(home: Path, daemon_env, make_job,
                                                                  monkeypatch) -> None:
    """Past the cap, a request line the watchdog already took in the same read is only counted (no
    event is made of it): the stored history is as the cap says, said once, and the job judged done."""
    (home / "config.toml").write_text("events_per_attempt = 100\n")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        client.start(str(make_job("server", ACCESS_LOG, probes='["python", "vllm", "uvicorn"]')), {})
        wait_until(lambda: job_state(client, "server") in {"done", "failed", "backoff"}, timeout=60)
        assert job_state(client, "server") == "done"
        events = client.events("server", attempt=1).events
        info = [e for e in events if e.kind == "info"]
        assert 90 <= len(info) <= 100, len(info)  # the cap: no request line stored past it
        said = [e for e in events if e.kind == "action" and "events_per_attempt" in e.message]
        assert len(said) == 1, [(e.kind, e.message) for e in events if e.kind != "info"]
    finally:
        daemon.close()
