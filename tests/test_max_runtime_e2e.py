"""`max_runtime`, end to end through a real daemon and the real CLI: an attempt still running past
it is stopped (its first signal, then its whole tree), judged `timeout` with its own reason and not
relaunched; after a daemon restart the limit still counts from the attempt's real start."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise
from test_kill_signal_first_e2e import TRAINER_JOB

# A healthy trainer that never ends: a bar step every 0.2 s, for ever; its pids and checkpoint as TRAINER_JOB's.
ENDLESS_JOB = TRAINER_JOB.replace("while True:\n    time.sleep(0.1)\n", """\
i = 3
while True:
    i += 1
    print(f"Loading checkpoint shards: 50%|###| {i}/100000 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.2)
""")


def _spec(make_job, home: Path, name: str, top: str, extra: str = "") -> Path:
    spec = make_job(name, ENDLESS_JOB, params=f', "{home / "ckpt"}", "{home / "pids"}"', extra=extra)
    spec.write_text(top + spec.read_text())  # make_job's extra lands in its [env] table
    return spec


def _procs(pid_file: Path) -> list[psutil.Process]:
    wait_until(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"))
    return [psutil.Process(int(p)) for p in pid_file.read_text().split()]


def _gone(procs: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def test_an_attempt_past_max_runtime_is_stopped_judged_timeout_and_not_relaunched(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    # health.action = "warn" would spare a stall: never a time limit.  Three attempts allowed: none used.
    spec = _spec(make_job, home, "capped", 'max_runtime = 3\nkill_signal_first = "SIGUSR1"\ncheckpoint_grace_s = 1\n',
                 extra='[health]\naction = "warn"\n')
    supervise(daemon_env, "start", str(spec))
    procs = _procs(home / "pids")
    client = daemon.client()
    wait_until(lambda: job_state(client, "capped") not in ("starting", "running"), timeout=30)
    assert job_state(client, "capped") == "failed"
    attempts = client.attempts("capped").attempts
    assert len(attempts) == 1, [a.verdict for a in attempts]  # not relaunched: its limit would come again
    attempt = attempts[0]
    assert attempt.verdict == "timeout" and attempt.reason == "ran past max_runtime 3.0s", attempt
    assert "timeout is not a verdict to relaunch on" in (attempt.action or ""), attempt.action
    assert (home / "ckpt").exists()  # the stop path: the first signal came before the kill
    wait_until(lambda: _gone(procs), timeout=10)
    events = client.events("capped").events
    launched = next(e.ts for e in events if e.kind == "launched")
    judged = next(e.ts for e in events if e.kind == "verdict" and e.data.get("verdict") == "timeout")
    assert 3.0 <= judged - launched < 8.0, judged - launched
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)


def test_max_runtime_counts_from_the_attempts_real_start_across_a_daemon_restart(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    spec = _spec(make_job, home, "readopted", "max_runtime = 8\n")
    supervise(daemon_env, "start", str(spec))
    procs = _procs(home / "pids")
    started = procs[0].create_time()
    wait_until(lambda: time.time() - started > 4.0, timeout=10)
    daemon.kill(signal.SIGKILL)  # the job runs on, detached
    daemon.start()
    restarted = time.time()
    client = daemon.client()
    wait_until(lambda: job_state(client, "readopted") == "failed", timeout=30)
    attempt = client.attempts("readopted").attempts[0]
    assert attempt.verdict == "timeout" and attempt.reason == "ran past max_runtime 8.0s", attempt
    judged = next(e.ts for e in client.events("readopted").events
                  if e.kind == "verdict" and e.data.get("verdict") == "timeout")
    # Counted from the restart it would come 8 s after it; from the real start, 8 s after that.
    assert judged - restarted < 7.0, (judged - restarted, judged - started)
    assert judged - started >= 8.0 - 0.5, judged - started
    wait_until(lambda: _gone(procs), timeout=10)
