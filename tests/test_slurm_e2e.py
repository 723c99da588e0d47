"""End to end through a real daemon whose jobs run on `host = "slurm:"`, against a real
single-node Slurm (slurmctld, slurmd and munged started by tests/slurm.py): submit, follow
and exit; a crash relaunched and stopped on the same failure twice; a stall ended with
scancel; a held job PENDING with its reason and never judged; a requeue counted as a
preemption; a daemon SIGKILLed and restarted re-adopting the job by its Slurm id."""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import CRASHING_JOB, PROGRESS_JOB, job_state, probe_events, progress_done, scheduler_ids, supervise

if TYPE_CHECKING:
    from slurm import SlurmCluster

pytest_plugins = ["slurm"]  # the session-scoped slurm_cluster fixture

HANG_JOB = """\
import time
print("Loading checkpoint shards: 50%|###| 1/2 [00:00<00:01, 5.0it/s]", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], slurm_cluster: SlurmCluster, home: Path) -> dict[str, str]:
    env = {**daemon_env, **slurm_cluster.env(), "SUPERVISE_SLURM_LOG_ROOT": str(home / "shared-logs"),
           "SUPERVISE_SLURM_POLL_S": "0.2"}
    return env


@pytest.fixture
def slurm_job(make_job: Callable[..., Path], home: Path) -> Callable[..., Path]:
    def make(name: str, script: str, *, slurm: str = "", **kwargs: str) -> Path:
        extra = kwargs.pop("extra", "") + (f"[slurm]\n{slurm}" if slurm else "")
        spec = make_job(name, script, extra=extra, **kwargs)
        # Top-level keys before [env]: a Slurm job names its interpreter and an absolute workdir.
        spec.write_text(f'host = "slurm:"\npython = "{sys.executable}"\nworkdir = "{spec.parent}"\n'
                        + spec.read_text())
        return spec

    return make


def test_slurm_job_is_submitted_followed_and_done(daemon: DaemonProcess, slurm_job, daemon_env, home: Path,
                                                  slurm_cluster: SlurmCluster) -> None:
    spec = slurm_job("sl-done", PROGRESS_JOB, params=', "10", "0.01"', slurm='time = "5"\nextra = ["--cpus-per-task=1"]\n')
    out = supervise(daemon_env, "start", str(spec))
    assert "started sl-done attempt 1" in out.stdout
    client = daemon.client()
    wait_until(lambda: job_state(client, "sl-done") == "done", timeout=30)
    attempt = client.attempts("sl-done").attempts[0]
    assert attempt.exit_code == 0 and attempt.verdict == "done" and attempt.host == "slurm:"
    assert attempt.log_path == str(home / "shared-logs" / "sl-done" / "attempt-1.log")
    [job_id] = scheduler_ids(home, "sl-done")
    assert job_id is not None and slurm_cluster.job_field(job_id, "JobState") == "COMPLETED"
    with sqlite3.connect(home / "supervise.db") as db:
        [(tag,)] = db.execute("SELECT tag FROM attempts WHERE job='sl-done'").fetchall()
    assert slurm_cluster.job_field(job_id, "JobName") == tag  # found by its tag if its id was never stored
    assert slurm_cluster.job_field(job_id, "TimeLimit") == "00:05:00"  # the [slurm] table reached sbatch
    launched = [e for e in client.events("sl-done").events if e.kind == "launched"]
    assert launched[0].message == f"attempt 1 launched: scheduler job {job_id}"
    logs = supervise(daemon_env, "logs", "sl-done").stdout
    assert "10/10 [00:00<00:01, 5.0it/s]" in logs and "all good" in logs
    assert [e.data["done"] for e in client.events("sl-done").events if e.kind == "progress"] == list(range(1, 11))


def test_slurm_crash_is_relaunched_then_stopped_on_the_same_failure_twice(daemon: DaemonProcess, slurm_job,
                                                                          home: Path) -> None:
    spec = slurm_job("sl-crash", CRASHING_JOB, extra="[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.1\n"
                                                     "backoff_jitter_s = 0\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "sl-crash") == "failed", timeout=40)
    attempts = client.attempts("sl-crash").attempts
    assert [a.verdict for a in attempts] == ["crashed", "crashed"]
    assert all(a.exit_code == 1 for a in attempts)
    assert "same failure twice" in (client.status("sl-crash").jobs[0].reason or "")
    ids = scheduler_ids(home, "sl-crash")
    assert len(set(ids)) == 2 and None not in ids  # two Slurm jobs, one per attempt


def test_slurm_stalled_job_is_cancelled(daemon: DaemonProcess, slurm_job, home: Path,
                                        slurm_cluster: SlurmCluster) -> None:
    spec = slurm_job("sl-stall", HANG_JOB, extra="[health]\nstall_floor_s = 1.0\nwaiting_s = 1.0\n"
                                                 "[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "sl-stall") == "failed", timeout=40)
    attempt = client.attempts("sl-stall").attempts[0]
    assert attempt.verdict == "stalled"
    assert attempt.exit_signal == 15  # scancel's TERM reached the command; the batch script recorded it
    [job_id] = scheduler_ids(home, "sl-stall")
    assert slurm_cluster.job_field(job_id, "JobState") in ("COMPLETED", "CANCELLED", "FAILED")
    actions = [e.message for e in client.events("sl-stall").events if e.kind == "action"]
    assert any(m.startswith("killed the process tree: 1 process: 1 ended on SIGTERM") for m in actions), actions


def test_slurm_held_job_shows_pending_and_its_reason_and_is_never_judged(
        daemon: DaemonProcess, slurm_job, home: Path, slurm_cluster: SlurmCluster) -> None:
    # waiting_s = 1: a job judged from its submission would be 'stalled' long before it runs.
    spec = slurm_job("sl-held", PROGRESS_JOB, params=', "4", "0.01"', slurm='extra = ["--hold"]\n',
                     extra="[health]\nwaiting_s = 1.0\nstall_floor_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "sl-held") == "waiting", timeout=20)
    status = client.status("sl-held").jobs[0]
    [job_id] = scheduler_ids(home, "sl-held")
    assert f"scheduler job {job_id} PENDING (JobHeldUser)" in (status.reason or "")
    assert "JobHeldUser" in supervise(daemon.env, "status", "sl-held").stdout
    time.sleep(3)  # three times waiting_s (a wait for nothing to happen): still waiting, no verdict
    assert job_state(client, "sl-held") == "waiting"
    assert client.attempts("sl-held").attempts[0].verdict is None
    slurm_cluster.command(["scontrol", "release", job_id])
    wait_until(lambda: job_state(client, "sl-held") == "done", timeout=30)
    assert client.attempts("sl-held").attempts[0].verdict == "done"


def test_slurm_requeue_is_a_preemption_that_spends_no_attempt(daemon: DaemonProcess, slurm_job, home: Path,
                                                              slurm_cluster: SlurmCluster) -> None:
    gate = home / "gate"  # attempt 1 holds at 5/10 until requeued; attempt 2 goes through
    spec = slurm_job("sl-requeue", PROGRESS_JOB, params=f', "10", "0.01", "{gate}"',
                     extra="[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "sl-requeue") >= 5, timeout=30)
    [job_id] = scheduler_ids(home, "sl-requeue")
    slurm_cluster.command(["scontrol", "requeue", job_id])
    wait_until(lambda: len(client.attempts("sl-requeue").attempts) == 2, timeout=30)
    gate.write_text("")
    wait_until(lambda: job_state(client, "sl-requeue") == "done", timeout=30)
    first, second = client.attempts("sl-requeue").attempts
    assert first.verdict == "preempted" and first.action == "relaunch in 0.0s"
    assert second.verdict == "done"  # relaunched although max_attempts = 1: a preemption is no failure
    # The requeued copy was cancelled: nothing runs twice.
    assert slurm_cluster.job_field(job_id, "JobState") == "CANCELLED"


def test_slurm_daemon_sigkill_and_restart_readopts_by_job_id(daemon: DaemonProcess, slurm_job, home: Path,
                                                             slurm_cluster: SlurmCluster) -> None:
    gate = home / "gate"
    spec = slurm_job("sl-steady", PROGRESS_JOB, params=f', "40", "0.01", "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "sl-steady") >= 10, timeout=30)
    [job_id] = scheduler_ids(home, "sl-steady")
    daemon.kill(signal.SIGKILL)
    assert slurm_cluster.job_field(job_id, "JobState") == "RUNNING"  # it runs on without its daemon
    daemon.start()
    client = daemon.client()
    wait_until(lambda: "re-adopted" in daemon.log_text())
    gate.write_text("")
    wait_until(lambda: job_state(client, "sl-steady") == "done", timeout=30)
    assert [d for _, _, d in probe_events(client, "sl-steady") if d is not None] == list(range(1, 41))
    attempts = client.attempts("sl-steady").attempts
    assert len(attempts) == 1 and attempts[0].exit_code == 0
    assert scheduler_ids(home, "sl-steady") == [job_id]
