"""Stall bounds from history and the ``slow`` alert, through a real daemon: the real paced
13-shard vLLM load (tests/data/pacing/) replayed and frozen at 5/13 twice as two attempts of one
job; the relaunch starts from the first attempt's stored shard intervals (its spec lets history
tighten the floor: ``learned_min_s``).  And the other way round: a second run slower than the
first is never killed for it while it moves."""

from __future__ import annotations

import json
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, DaemonProcess, wait_until
from e2e_jobs import AlertSink, supervise

PACING = REPO / "tests" / "data" / "pacing"
STALL_TSV = PACING / "vllm-0.23-6.7b-serve-stall-at-5of13.arrivals.tsv"
REPLAY = REPO / "tests" / "jobs" / "replay.py"
PACKS = '["python", "cuda", "nccl", "vllm", "tqdm", "transformers"]'
FLOOR_S = 6.0


@pytest.fixture
def alerting_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon_env["SUPERVISE_POLL_INTERVAL_S"] = "3600"
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    yield daemon
    daemon.close()
    server.shutdown()
    server.server_close()


def test_a_relaunch_flags_the_frozen_load_from_history_and_says_slow_first(
        alerting_daemon: DaemonProcess, home: Path, daemon_env: dict[str, str]) -> None:
    spec = home / "load.toml"
    command = json.dumps([sys.executable, str(REPLAY), str(STALL_TSV), "--arrivals", str(STALL_TSV), "--speed", "2",
                          "--collapse-gaps-over", "0.5", "--freeze-after", "42"])
    spec.write_text(f'name = "load"\ncommand = {command}\nprobes = {PACKS}\nstop_grace_s = 1\n'
                    f"[health]\nstall_floor_s = {FLOOR_S}\nlearned_min_s = 0.5\nslow_floor_s = 0.1\n"
                    "[restart]\nmax_attempts = 2\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    client = alerting_daemon.client()
    client.start(str(spec), {})

    def frozen_bound():  # the first attempt at 5/13: its bar's bound is the floor, and says so
        job = client.status("load").jobs[0]
        progress = job.attempt.progress if job.attempt is not None else None
        return job.stall_bounds if progress is not None and progress.done == 5 and job.attempt.n == 1 else None

    [bound] = wait_until(frozen_bound, timeout=60)
    assert (bound.bound_s, bound.kind, bound.source) == (FLOOR_S, "default_floor", "stall_floor_s")
    assert 0 < bound.in_s <= FLOOR_S and bound.history_runs is None
    assert "Loading safetensors checkpoint shards" in bound.bar
    shown = supervise({**daemon_env, "SUPERVISE_HOME": str(home)}, "status", "load").stdout
    assert "stall bound 6s (stall_floor_s) for Loading safetensors checkpoint shards" in shown, shown
    wait_until(lambda: len(client.attempts("load").attempts) == 2 and client.status("load").jobs[0].state == "failed",
               timeout=90)
    events = client.events("load").events

    def stalled(n: int):
        return next(e for e in events if e.attempt == n and e.kind == "verdict" and e.data.get("verdict") == "stalled")

    def detection(n: int) -> float:
        last = max(e.ts for e in events if e.attempt == n and e.kind == "progress")
        return stalled(n).ts - last

    first, second = stalled(1), stalled(2)
    assert first.data["bound_source"] == "stall_floor_s" and first.data["bound_s"] == FLOOR_S
    assert second.data["bound_source"].startswith("history (") and "from 1 run)" in second.data["bound_source"]
    assert "5/13" in second.message
    assert detection(2) < FLOOR_S / 2 < detection(1)
    # Slow before stalled, as an alert (the process was not killed for it) and an event.
    slow = [a for a in AlertSink.received if "slow" in json.dumps(a)]
    assert len(slow) == 1, AlertSink.received
    body = json.dumps(slow[0])
    assert "load: slow at shard 5/13" in body and "history p95" in body and "stalled if no step for" in body
    slow_event = next(e for e in events if e.attempt == 2 and e.kind == "action" and e.data.get("slow"))
    assert slow_event.ts <= second.ts
    assert not [e for e in events if e.attempt == 1 and e.kind == "action" and e.data.get("slow")]


# A shard bar whose pace is read from a file, so that two runs of one command (one pace history) can
# go at different speeds: a warm page cache one day, a slow filesystem the next.
PACED_LOAD = """\
import sys, time
delay = float(open(sys.argv[1]).read())
n = 5
print("starting", flush=True)
for i in range(n + 1):
    print(f"Loading checkpoint shards: {100*i//n}%|###| {i}/{n} [00:00<00:01, 5.0it/s]", flush=True)
    if i < n:
        time.sleep(delay)
print("all good", flush=True)
"""


def test_a_second_run_slower_than_the_first_is_slow_never_stalled(
        alerting_daemon: DaemonProcess, home: Path, make_job) -> None:
    pace = home / "pace"
    pace.write_text("0.05")
    spec = make_job("paced", PACED_LOAD, params=f', "{pace}"',
                    extra="[health]\nstall_floor_s = 20\nslow_floor_s = 0.5\n[restart]\nmax_attempts = 2\n")
    client = alerting_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("paced").jobs[0].state == "done", timeout=30)
    pace.write_text("1.3")  # 26 x slower: the first run's bound (1 s) would kill it at its first shard
    client.start(str(spec), {})

    def moving_bound():
        job = client.status("paced").jobs[0]
        moving = job.attempt is not None and job.attempt.n == 2 and job.attempt.progress is not None
        return job.stall_bounds if moving and job.attempt.progress.done >= 1 else None

    [bound] = wait_until(moving_bound, timeout=30)
    assert (bound.bound_s, bound.kind) == (20.0, "default_floor")
    def second_verdict():
        found = [e for e in client.events("paced").events if e.kind == "verdict" and e.attempt == 2]
        return found and client.status("paced").jobs[0].state in ("done", "failed", "backoff")

    wait_until(second_verdict, timeout=60)
    job = client.status("paced").jobs[0]
    events = client.events("paced").events
    verdicts = [(e.attempt, e.data.get("verdict")) for e in events if e.kind == "verdict"]
    assert job.state == "done" and verdicts == [(1, "done"), (2, "done")], (job, verdicts)
    # It was slow against the first run, and said so: an action event, never a kill.
    assert [e for e in events if e.attempt == 2 and e.kind == "action" and e.data.get("slow")]
