"""Health and relaunch with real processes replaying real corpus logs, through a real daemon."""

from __future__ import annotations

import json
import sys
import threading
from http.server import ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import REPO, DaemonProcess, wait_until
from e2e_jobs import HANG_AFTER_FAILURE_JOB, AlertSink

from supervisor.cli.client import Client

CORPUS = REPO / "tests" / "data" / "corpus"
PACING = REPO / "tests" / "data" / "pacing"
STALL_TSV = PACING / "vllm-0.23-6.7b-serve-stall-at-5of13.arrivals.tsv"
REPLAY = REPO / "tests" / "jobs" / "replay.py"
PACKS = '["python", "cuda", "nccl", "vllm", "tqdm", "transformers"]'


def replay_spec(home: Path, name: str, args: list[str], extra: str = "") -> Path:
    spec = home / f"{name}.toml"
    command = json.dumps([sys.executable, str(REPLAY), *args])
    spec.write_text(f'name = "{name}"\ncommand = {command}\nprobes = {PACKS}\nstop_grace_s = 1\n' + extra)
    return spec


def finished(client: Client, job: str) -> bool:
    return client.status(job).jobs[0].state in ("done", "failed", "stopped")


@pytest.fixture
def fast_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    # Every poll interval at an hour: anything prompt below is event-driven.
    daemon_env["SUPERVISE_POLL_INTERVAL_S"] = "3600"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    d = DaemonProcess(home, daemon_env)
    d.start()
    yield d
    d.close()


def test_healthy_paced_load_is_never_flagged(fast_daemon: DaemonProcess, home: Path) -> None:
    spec = replay_spec(home, "healthy", [str(STALL_TSV), "--arrivals", str(STALL_TSV), "--speed", "2",
                                         "--collapse-gaps-over", "0.5"],
                       "[health]\nstall_floor_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "healthy"), timeout=60)
    attempt = client.attempts("healthy").attempts[0]
    assert attempt.verdict == "done", attempt.reason
    events = client.events("healthy").events
    shards = [e.data["done"] for e in events if e.kind == "progress" and "shard" in (e.probe or "")]
    assert shards and max(shards) == 13
    assert not [e for e in events if e.kind == "verdict" and e.data.get("verdict") == "stalled"]


def test_frozen_shard_load_is_flagged_within_the_bound_and_killed(fast_daemon: DaemonProcess, home: Path) -> None:
    spec = replay_spec(home, "frozen", [str(STALL_TSV), "--arrivals", str(STALL_TSV), "--speed", "2",
                                        "--collapse-gaps-over", "0.5", "--freeze-after", "42"],
                       "[health]\nstall_floor_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "frozen"), timeout=60)
    attempt = client.attempts("frozen").attempts[0]
    assert attempt.verdict == "stalled", attempt.reason
    assert "5/13" in (attempt.reason or "")
    events = client.events("frozen").events
    last_progress = max(e.ts for e in events if e.kind == "progress")
    flagged = next(e.ts for e in events if e.kind == "verdict" and e.data.get("verdict") == "stalled")
    assert 1.0 <= flagged - last_progress < 3.0  # the bound is max(floor 1 s, 3 x ~0.075 s)
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)
    assert attempt.exit_signal == 15  # SIGTERM; the wrapper, spared, recorded it


def test_crash_is_seen_at_exit_and_same_crash_twice_stops(fast_daemon: DaemonProcess, home: Path) -> None:
    # A rank's ValueError, then torchrun's echoes of it (the agent's line, ChildFailedError).
    log = CORPUS / "device-logs" / "run-torchrun-rank1-valueerror-startup.log"
    spec = replay_spec(home, "crash", [str(log), "--exit", "1"],
                       "[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "crash"), timeout=60)
    attempts = client.attempts("crash").attempts
    assert len(attempts) == 2  # the second identical failure stops the loop
    assert attempts[0].verdict == "crashed" and attempts[0].failure is not None
    assert attempts[0].failure.traceback and attempts[0].failure.line.startswith("ValueError: unsupported lr")
    assert attempts[0].fingerprint == attempts[1].fingerprint
    assert "same failure twice" in (attempts[1].action or "")
    assert client.status("crash").jobs[0].state == "failed"
    failures = [e for e in client.events("crash").events if e.kind == "failure" and e.attempt == 1]
    # Each failure event arrives with its typed failure, not as keys among its data; the
    # attempt keeps the root cause, not the latest echo of it.
    assert failures and all(e.failure is not None and "fingerprint" not in e.data for e in failures)
    assert failures[0].failure == attempts[0].failure != failures[-1].failure
    exited = [e for e in client.events("crash").events if e.kind in ("exited", "verdict") and e.attempt == 1]
    # With every poll at an hour, the verdict follows the exit at once.
    assert exited[-1].ts - exited[0].ts < 2.0


def test_a_hang_after_a_failure_is_judged_killed_and_the_same_hang_twice_stops(
    fast_daemon: DaemonProcess, home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG_AFTER_FAILURE_JOB)
    spec = home / "hang.toml"
    spec.write_text(f'name = "hang"\ncommand = ["{sys.executable}", "{script}"]\nstop_grace_s = 1\n'
                    "[health]\nhang_after_failure_s = 1.0\n"
                    "[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "hang"), timeout=60)
    attempts = client.attempts("hang").attempts
    assert len(attempts) == 2 and client.status("hang").jobs[0].state == "failed"
    first = attempts[0]
    assert first.verdict == "crashed"
    assert first.reason == "hung after a failure, no output for 1.0s: RuntimeError: shard 3 of the dataset is corrupt"
    assert first.exit_signal == 15  # killed by us, SIGTERM; the spared wrapper recorded it
    assert first.fingerprint and first.fingerprint == attempts[1].fingerprint
    assert "same failure twice" in (attempts[1].action or "")
    events = [e for e in client.events("hang").events if e.attempt == 1]
    judged = next(e.ts for e in events if e.kind == "verdict")
    # Its last line came ~0.2 s after the start; with every poll at an hour, the verdict
    # comes from the rule's own deadline, 1 s after that line.
    assert 1.0 <= judged - first.started < 4.0
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)


WAITING_JOB = """\
import sys, time
for i in (1, 2):
    print(f"Loading checkpoint shards: {50 * i}%|###| {i}/2 [00:00<00:00, 9.0it/s]", flush=True)
while True:  # what vLLM's engine may print while a rank hangs; seen on 2 H200s: nothing at all
    if sys.argv[1] == "waiting-lines":
        print("(EngineCore pid=127) INFO 04-15 13:42:25 [shm_broadcast.py:681] No available shared memory "
              "broadcast block found in 60 seconds. This typically happens when some processes are hanging.",
              flush=True)
    time.sleep(0.2)
"""


@pytest.mark.parametrize(("mode", "reason"), [
    ("waiting-lines", "only 'still waiting' lines for 1.5s in start-up phase weight_loading (limit 1.5s): "),
    ("silence", "no output for 1.5s in start-up phase weight_loading (limit 1.5s)"),
])
def test_waiting_after_loading_is_a_stall(fast_daemon: DaemonProcess, home: Path, tmp_path: Path, mode: str,
                                          reason: str) -> None:
    script = tmp_path / "waiting.py"
    script.write_text(WAITING_JOB)
    spec = home / "waiting.toml"
    spec.write_text(f'name = "waiting"\ncommand = ["{sys.executable}", "{script}", "{mode}"]\nstop_grace_s = 1\n'
                    'probes = ["vllm", "transformers"]\n[health]\nwaiting_s = 1.5\n[restart]\nmax_attempts = 1\n')
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "waiting"), timeout=30)
    attempt = client.attempts("waiting").attempts[0]
    assert attempt.verdict == "stalled"
    assert (attempt.reason or "").startswith(reason)
    events = client.events("waiting").events
    heartbeats = sum(1 for e in events if e.kind == "info" and e.data.get("heartbeat"))
    assert heartbeats >= 5 if mode == "waiting-lines" else heartbeats == 0
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)


def test_cuda_oom_is_classified_as_oom(fast_daemon: DaemonProcess, home: Path) -> None:
    log = CORPUS / "device-logs" / "torch-oom.log"
    spec = replay_spec(home, "oom", [str(log), "--exit", "1"], "[restart]\nmax_attempts = 1\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "oom"), timeout=60)
    attempt = client.attempts("oom").attempts[0]
    assert attempt.verdict == "oom" and attempt.failure is not None and attempt.failure.kind == "cuda_oom"


def test_backoff_spaces_relaunches(fast_daemon: DaemonProcess, home: Path, tmp_path: Path) -> None:
    counter = tmp_path / "n"
    script = tmp_path / "flaky.py"
    # A different failure each time (no repeat fingerprint), so only the backoff limits relaunches.
    script.write_text(f"import os\np='{counter}'\nn=int(open(p).read()) if os.path.exists(p) else 0\n"
                      "open(p,'w').write(str(n+1))\nraise RuntimeError('failure number ' + 'x' * n)\n")
    spec = home / "flaky.toml"
    spec.write_text(f'name = "flaky"\ncommand = ["{sys.executable}", "{script}"]\n'
                    "[restart]\nmax_attempts = 3\nbackoff_initial_s = 1.0\nbackoff_jitter_s = 0\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "flaky"), timeout=60)
    attempts = client.attempts("flaky").attempts
    assert len(attempts) == 3
    for before, after in pairwise(attempts):
        assert after.started - (before.ended or 0) >= 0.95


def test_alert_reaches_a_real_http_endpoint(home: Path, daemon_env: dict[str, str], monkeypatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        log = CORPUS / "device-logs" / "torch-oom.log"
        spec = replay_spec(home, "alerting", [str(log), "--exit", "1"], "[restart]\nmax_attempts = 1\n")
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: AlertSink.received, timeout=60)
        body = json.dumps(AlertSink.received[0])
        assert "alerting" in body and "attempt 1" in body and "oom" in body
        assert "OutOfMemoryError" in body and "gave up" in body and "GPU" in body
    finally:
        daemon.close()
        server.shutdown()
        server.server_close()


def test_tp_worker_death_then_exit_zero_is_a_crash(fast_daemon: DaemonProcess, home: Path) -> None:
    # A real TP=2 log: one worker SIGKILLed after ready; vLLM shut down and exited 0.
    log = REPO / "tests" / "data" / "tp2" / "vllm-0.23-tp2-worker1-sigkill.log"
    spec = replay_spec(home, "tp", [str(log), "--exit", "0"],
                       "[restart]\nmax_attempts = 3\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "tp"), timeout=60)
    attempts = client.attempts("tp").attempts
    assert attempts[0].verdict == "crashed", attempts[0].reason
    assert "VllmWorker-1 died unexpectedly" in (attempts[0].reason or "")
    assert attempts[0].phase == "engine_ready"
    assert len(attempts) == 2 and "same failure twice" in (attempts[1].action or "")


def test_a_ready_server_answering_with_its_engine_dead_is_judged_crashed(
        fast_daemon: DaemonProcess, home: Path, tmp_path: Path) -> None:
    # Real lines: the 0.23 server's ready line (tests/data/pacing/), then a V1 server's EngineDeadError and
    # its "500 Internal Server Error" answers (tests/data/engine_dead/v1-engine-dead-500.log), the answers
    # going on for as long as the replay runs; then it hangs, alive, as such a server does.
    ready = "(APIServer pid=678) INFO 11-29 15:07:24 [launcher.py:37] Available routes are:\n"
    dead = (REPO / "tests" / "data" / "engine_dead" / "v1-engine-dead-500.log").read_text().splitlines(keepends=True)
    log = tmp_path / "serve.log"
    log.write_text(ready + "".join(dead) + "".join(dead[-2:] * 60))
    records = 1 + len(dead) + 120
    spec = replay_spec(home, "deadengine", [str(log), "--interval", "0.05", "--freeze-after", str(records)],
                       "[health]\nhang_after_failure_s = 2\n[restart]\nmax_attempts = 1\n")
    client = fast_daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "deadengine"), timeout=60)
    attempt = client.attempts("deadengine").attempts[0]
    assert attempt.verdict == "crashed", attempt.reason
    assert "after a fatal failure" in (attempt.reason or "") and "EngineDeadError" in (attempt.reason or "")
    events = client.events("deadengine").events
    verdict = next(e for e in events if e.kind == "verdict")
    launched = next(e for e in events if e.kind == "launched")
    # Judged while it still answered: the replay writes its last answer 6 s after its start.
    assert verdict.data["since_fatal_s"] >= 2 and verdict.ts - launched.ts < records * 0.05 - 1
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)
