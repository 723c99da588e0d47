"""Alerts of every kind, health actions (warn, warn_then_kill), hold/release and killed vs oom,
through a real daemon whose alerts reach a real local HTTP endpoint as apprise JSON."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, DaemonProcess, wait_until
from e2e_jobs import AlertSink, supervise

from supervisor.cli.client import Client

CRASH_LOG = REPO / "tests" / "data" / "corpus" / "device-logs" / "run-torchrun-rank1-valueerror-startup.log"
REPLAY = REPO / "tests" / "jobs" / "replay.py"

# A checkpoint-loading bar of N steps 0.05 s apart; "--pause I:S" stops S seconds after step I
# (S = -1: for good); "--pid FILE" writes the pid first.  Exits 0 at the end.
LOADER = """\
import argparse, os, time
p = argparse.ArgumentParser()
p.add_argument("steps", type=int)
p.add_argument("--pause", action="append", default=[])
p.add_argument("--pid")
a = p.parse_args()
if a.pid:
    open(a.pid, "w").write(str(os.getpid()))
pauses = {int(i): float(s) for i, s in (x.split(":") for x in a.pause)}
for i in range(1, a.steps + 1):
    print(f"Loading checkpoint shards: {100 * i // a.steps}%|###| {i}/{a.steps} [00:00<00:00, 9.0it/s]", flush=True)
    if pauses.get(i, 0) < 0:
        while True:
            time.sleep(1)
    time.sleep(pauses.get(i, 0.05))
print("all done", flush=True)
"""


@pytest.fixture
def alerting(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    daemon_env["SUPERVISE_POLL_INTERVAL_S"] = "3600"  # anything prompt below is event-driven
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()
        server.shutdown()
        server.server_close()


def titles() -> list[str]:
    return [a["title"] for a in AlertSink.received]


def sent(prefix: str) -> list[dict]:
    return [a for a in AlertSink.received if a["title"].startswith(prefix)]


def loader_spec(home: Path, tmp_path: Path, name: str, args: list[str], extra: str) -> Path:
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    spec = home / f"{name}.toml"
    spec.write_text(f"name = {json.dumps(name)}\ncommand = {json.dumps([sys.executable, str(script), *args])}\n"
                    'probes = ["python", "tqdm", "transformers"]\nstop_grace_s = 1\n' + extra)
    return spec


def finished(client: Client, job: str) -> bool:
    return client.status(job).jobs[0].state in ("done", "failed", "stopped")


def killed_tree(client: Client, job: str) -> bool:
    return any(e.kind == "action" and "killed the process tree" in e.message for e in client.events(job).events)


def test_phase_eta_and_done_alerts(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    spec = loader_spec(home, tmp_path, "load", ["10"],
                       '[alerts]\nnotify_phases = ["weight_loading"]\neta_at_percent = [50]\n')
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: sent("load: done"), timeout=30)
    assert client.attempts("load").attempts[0].verdict == "done"
    phase = sent("load: weight_loading after ")
    eta = [a for a in AlertSink.received if "%" in a["title"]]
    assert len(phase) == 1 and "next: nothing: watching on" in phase[0]["message"], titles()
    # The 50% mark, once, when 5 of 10 shards were in: how far, how long, how long left.
    assert len(eta) == 1 and ": 50% after " in eta[0]["title"] and "ETA " in eta[0]["title"], titles()
    assert eta[0]["title"].startswith("load: checkpoint_shards: 50% after ")
    assert "what: checkpoint_shards 5/10" in eta[0]["message"]
    done = sent("load: done")[0]
    assert "attempt 1 finished after" in done["message"] and "next: nothing: the job is done" in done["message"]
    kinds = [e.data.get("kind") for e in client.events("load").events if e.kind == "alert"]
    assert sorted(kinds) == ["done", "eta", "phase"]


def test_verdict_then_gave_up_each_with_its_title(alerting: DaemonProcess, home: Path) -> None:
    spec = home / "crash.toml"
    spec.write_text(f"name = \"crash\"\ncommand = {json.dumps([sys.executable, str(REPLAY), str(CRASH_LOG), '--exit', '1'])}\n"
                    'probes = ["python", "torch"]\n'
                    "[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: sent("crash: gave up"), timeout=60)
    first, last = AlertSink.received[0], sent("crash: gave up")[0]
    assert first["title"] == "crash: attempt 1 crashed"
    assert "next: relaunch in 0.2s" in first["message"] and "ValueError: unsupported lr" in first["message"]
    assert last["title"].startswith("crash: gave up: same failure twice in a row (fingerprint ")
    assert "attempt 2 crashed; not relaunching" in last["message"]
    assert "next: nothing: the job has failed; `supervise restart crash` starts it again" in last["message"]
    assert len(AlertSink.received) == 2, titles()


def test_warn_never_kills_and_repeats_are_deduplicated(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    # Two stalls of 2 s (floor 1 s) in one attempt: two warnings and two recoveries, one of each sent.
    spec = loader_spec(home, tmp_path, "warned", ["8", "--pause", "3:2", "--pause", "6:2"],
                       '[health]\nstall_floor_s = 1.0\naction = "warn"\n[restart]\nmax_attempts = 1\n')
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "warned"), timeout=30)
    wait_until(lambda: sent("warned: done"), timeout=10)
    attempt = client.attempts("warned").attempts[0]
    assert attempt.verdict == "done" and attempt.exit_signal is None
    assert not killed_tree(client, "warned")
    events = client.events("warned").events
    warned = [e for e in events if e.kind == "verdict" and e.data.get("verdict") == "stalled"]
    assert len(warned) == 2  # each stall recorded as a verdict
    moving = [e for e in events if e.kind == "action" and e.message.startswith("moving again")]
    assert len(moving) == 2 and all("warning over" in e.message for e in moving)
    warning = sent("warned: stalled at checkpoint_shard 3/8")
    assert len(warning) == 1, titles()  # the second stall's warning: same incident, suppressed
    assert 'never killed for this' in warning[0]["message"]
    assert len(sent("warned: moving again")) == 1
    assert not sent("warned: stalled at checkpoint_shard 6/8")


def test_burst_of_alerts_is_capped(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    marks = ", ".join(str(m) for m in range(5, 100, 5))  # 19 distinct ETA alerts within a second
    spec = loader_spec(home, tmp_path, "bursty", ["40"], f"[alerts]\neta_at_percent = [{marks}]\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "bursty"), timeout=30)
    time.sleep(0.5)  # deliveries finish after the job's end is stored
    assert len(AlertSink.received) == 10, titles()  # the alerter's burst cap (max_burst) within the interval


def test_warn_then_kill_kills_without_progress(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    spec = loader_spec(home, tmp_path, "frozen", ["8", "--pause", "3:-1"],
                       '[health]\nstall_floor_s = 1.0\naction = "warn_then_kill"\nkill_after_s = 1.5\n'
                       "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "frozen"), timeout=30)
    attempt = client.attempts("frozen").attempts[0]
    assert attempt.verdict == "stalled" and "3/8" in (attempt.reason or "")
    warning = sent("frozen: stalled at checkpoint_shard 3/8; killing in 2 s unless it moves")
    assert len(warning) == 1, titles()
    events = client.events("frozen").events
    verdicts = [e.ts for e in events if e.kind == "verdict"]
    kill = next(e.ts for e in events if e.kind == "action" and "killed the process tree" in e.message)
    assert len(verdicts) == 2 and 1.4 <= verdicts[1] - verdicts[0] < 3.0  # kill_after_s after the warning
    assert kill >= verdicts[1]
    wait_until(lambda: sent("frozen: gave up"), timeout=10)


def test_warn_then_kill_is_cancelled_by_progress(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    spec = loader_spec(home, tmp_path, "slowish", ["6", "--pause", "3:2.5"],
                       '[health]\nstall_floor_s = 1.0\naction = "warn_then_kill"\nkill_after_s = 5\n'
                       "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "slowish"), timeout=30)
    wait_until(lambda: sent("slowish: done"), timeout=10)
    assert client.attempts("slowish").attempts[0].verdict == "done"
    assert not killed_tree(client, "slowish")
    assert sent("slowish: stalled at checkpoint_shard 3/6; killing in 5 s unless it moves")
    cancelled = sent("slowish: moving again at checkpoint_shard 4/6; the pending kill is cancelled")
    assert len(cancelled) == 1, titles()
    assert "next: nothing: the pending kill is cancelled, watching on" in cancelled[0]["message"]


def test_hold_postpones_the_kill_until_release(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    spec = loader_spec(home, tmp_path, "held", ["8", "--pause", "3:-1"],
                       '[health]\nstall_floor_s = 1.0\naction = "warn_then_kill"\nkill_after_s = 0.5\n'
                       "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    assert client.hold("held").held
    wait_until(lambda: sent("held: stalled at checkpoint_shard 3/8"), timeout=30)
    warning = sent("held: stalled at checkpoint_shard 3/8")[0]
    assert "nothing while held: `supervise release held` lets a kill come" in warning["message"]
    time.sleep(1.5)  # three times kill_after_s: held, nothing is killed
    assert client.status("held").jobs[0].state == "running" and not killed_tree(client, "held")
    released = client.release("held")
    assert not released.held and "killing in 0 s unless it moves" in released.message
    wait_until(lambda: finished(client, "held"), timeout=10)
    assert client.attempts("held").attempts[0].verdict == "stalled"
    assert killed_tree(client, "held")
    actions = [e.message for e in client.events("held").events if e.kind == "action"]
    assert "held held: no kill until `supervise release held`" in actions
    assert "held released: killing in 0 s unless it moves" in actions


def test_hold_of_an_unknown_job_is_66_and_of_a_stopped_job_says_so(alerting: DaemonProcess, home: Path,
                                                                   tmp_path: Path, daemon_env: dict[str, str]) -> None:
    result = supervise(daemon_env, "hold", "nope", check=False)
    assert result.returncode == 66 and "nope" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    spec = loader_spec(home, tmp_path, "quick", ["2"], "")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "quick"), timeout=30)
    result = supervise(daemon_env, "release", "quick", check=False)
    assert result.returncode == 0 and "quick is not running: nothing to release" in result.stdout


def test_outside_kill_9_is_killed_not_oom(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    spec = loader_spec(home, tmp_path, "victim", ["4", "--pause", "2:-1", "--pid", str(pid_file)],
                       "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
    wait_until(lambda: any(e.kind == "progress" for e in client.events("victim").events), timeout=30)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    wait_until(lambda: finished(client, "victim"), timeout=30)
    attempt = client.attempts("victim").attempts[0]
    assert attempt.verdict == "killed", attempt.reason
    assert attempt.reason == "SIGKILL from outside the supervisor (the kernel reported no OOM kill)"
    wait_until(lambda: sent("victim: gave up"), timeout=10)


def _memory_cgroup_root(home: Path) -> Path | None:
    """Where attempts' cgroups go, when the memory controller reaches them (else None)."""
    from supervisor.hosts.local.cgroup import ContainmentKind, detect

    containment = detect()
    if containment.kind is not ContainmentKind.CGROUP or containment.root is None:
        return None
    try:
        controllers = (containment.root / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            return None
        subtree = containment.root / "cgroup.subtree_control"
        if "memory" not in subtree.read_text().split():
            subtree.write_text("+memory")
    except OSError:
        return None
    return containment.root


MEMORY_HOG = """\
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
print("allocating", flush=True)
hog = [bytearray(16 << 20) for _ in range(64)]  # 1 GiB, far over the limit set by the test
time.sleep(60)
"""


def test_a_real_oom_kill_in_a_memory_limited_cgroup_is_oom(alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    root = _memory_cgroup_root(home)
    if root is None:
        pytest.skip("no cgroup v2 with the memory controller for attempts here")
    script, pid_file, go = tmp_path / "hog.py", tmp_path / "pid", tmp_path / "go"
    script.write_text(MEMORY_HOG)
    spec = home / "hog.toml"
    spec.write_text(f"name = \"hog\"\ncommand = {json.dumps([sys.executable, str(script), str(pid_file), str(go)])}\n"
                    "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
    tag = client.attempts("hog").attempts[0]
    groups = [g for g in root.iterdir() if g.is_dir() and (g / "memory.max").exists()
              and pid_file.read_text() in (g / "cgroup.procs").read_text().split()]
    assert len(groups) == 1, tag
    (groups[0] / "memory.swap.max").write_text("0") if (groups[0] / "memory.swap.max").exists() else None
    (groups[0] / "memory.max").write_text(str(64 << 20))
    go.write_text("")
    wait_until(lambda: finished(client, "hog"), timeout=60)
    attempt = client.attempts("hog").attempts[0]
    assert attempt.verdict == "oom", attempt.reason
    assert attempt.reason.startswith("killed by the kernel's OOM killer: cgroup memory.events: oom_kill ")


def test_a_crash_loop_is_one_verdict_alert_and_its_end_says_how_many_were_folded_in(
        alerting: DaemonProcess, home: Path) -> None:
    # Five attempts crash in a few seconds: at most one alert per job and kind per interval.
    spec = home / "loop.toml"
    spec.write_text(f"name = \"loop\"\ncommand = {json.dumps([sys.executable, str(REPLAY), str(CRASH_LOG), '--exit', '1'])}\n"
                    'probes = ["python", "torch"]\n'
                    "[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\nstop_on_repeat = false\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: sent("loop: gave up"), timeout=60)
    assert len(client.attempts("loop").attempts) == 5
    assert titles() == ["loop: attempt 1 crashed", "loop: gave up: attempt 5/5 failed: giving up"], titles()
    verdict, gave_up = AlertSink.received
    assert verdict["type"] == "failure" and gave_up["type"] == "failure"
    assert "(the loop is over: 3 more alert(s) folded in since the last sent: 3 x crashed)" in gave_up["message"]
    assert "GPU: GPU:" not in verdict["message"]
    severities = {e.data.get("severity") for e in client.events("loop").events if e.kind == "alert"}
    assert severities == {"failure"}


class _Hanging(BaseHTTPRequestHandler):
    """An alert endpoint that reads the request and never answers."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(3600)

    def log_message(self, *args: object) -> None:
        return None


def test_a_hanging_alert_endpoint_does_not_slow_the_relaunches(home: Path, daemon_env: dict[str, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hanging)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    daemon_env["SUPERVISE_ALERT_MIN_INTERVAL_S"] = "0"  # every alert is sent: each would wait on the endpoint
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        spec = home / "hang.toml"
        spec.write_text(f"name = \"hang\"\ncommand = {json.dumps([sys.executable, '-c', 'raise SystemExit(3)'])}\n"
                        "[restart]\nmax_attempts = 3\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n"
                        "stop_on_repeat = false\n")
        client = daemon.client()
        started = time.monotonic()
        client.start(str(spec), {})
        # Three attempts and their backoffs take about a second; an alert waited on inline took
        # ~4.5 s each (apprise's own timeout), so three verdicts and the give-up took over 13 s.
        wait_until(lambda: client.status("hang").jobs[0].state == "failed", timeout=30)
        assert time.monotonic() - started < 8, time.monotonic() - started
        assert client.ping() is not None
        metrics = supervise({**daemon_env, "SUPERVISE_HOME": str(home)}, "status", "--json").returncode == 0
        assert metrics
    finally:
        daemon.close()
        server.shutdown()
        server.server_close()


STUCK_LOADER = """\
import time
def stuck_in_here():
    while True:
        time.sleep(1)
for i in range(1, 4):
    print(f"Loading checkpoint shards: {i * 10}%|###| {i}/10 [00:00<00:01, 9.0it/s]", flush=True)
    time.sleep(0.05)
stuck_in_here()
"""


def test_a_warning_that_a_job_may_be_stuck_carries_its_stacks_and_never_kills(
        alerting: DaemonProcess, home: Path, tmp_path: Path) -> None:
    """`warn` is the default where a kill could be wrong: the stacks that would have been dumped
    before the kill are dumped at the warning, stored, and sent with it; the job runs on."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_LOADER)
    spec = home / "stuckwarn.toml"
    spec.write_text(f"name = \"stuckwarn\"\ncommand = {json.dumps([sys.executable, str(script)])}\n"
                    'probes = ["python", "tqdm", "transformers"]\nstop_grace_s = 1\n'
                    '[health]\nstall_floor_s = 1.0\naction = "warn"\n[restart]\nmax_attempts = 1\n')
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: sent("stuckwarn: stalled at checkpoint_shard 3/10"), timeout=30)
    warning = sent("stuckwarn: stalled at checkpoint_shard 3/10")[0]
    assert "stacks: pid " in warning["message"] and "stuck_in_here" in warning["message"], warning["message"]
    stored = [e for e in client.events("stuckwarn").events if e.kind == "stacks"]
    assert len(stored) == 1 and stored[0].message.startswith("stacks at the warning (stalled): ")
    assert any("stuck_in_here" in (p["stack"] or "") for p in stored[0].data["processes"])
    status = client.status("stuckwarn").jobs[0]
    assert status.state == "running" and status.stacks is not None and "stuck_in_here" in status.stacks
    assert not killed_tree(client, "stuckwarn")
    client.stop("stuckwarn", 1)
