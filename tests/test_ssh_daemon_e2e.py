"""End to end through a real daemon whose jobs run on `ssh://...` (a real sshd on loopback):
launch, follow, phase/progress events, crash, stop with an escaped grandchild, dropped
connections and a daemon restart that re-adopts a running remote job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import (
    CR_BAR_JOB,
    CRASHING_JOB,
    PROGRESS_JOB,
    check_redraw_read_while_it_waits,
    escaping_job,
    job_state,
    probe_events,
    progress_done,
    supervise,
)

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]  # the session-scoped sshd_server fixture

@pytest.fixture
def daemon_env(daemon_env: dict[str, str], sshd_server: SshServer, home: Path) -> dict[str, str]:
    """The daemon reaches the test sshd through SUPERVISE_SSH_*; its HOME is the test's, so the
    real ~/.ssh is never read."""
    env = dict(daemon_env)
    env.update(sshd_server.env())
    env["SUPERVISE_SSH_LOG_ROOT"] = str(home / "remote-logs")
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env


@pytest.fixture
def ssh_job(make_job: Callable[..., Path], sshd_server: SshServer) -> Callable[..., Path]:
    def make(name: str, script: str, **kwargs: str) -> Path:
        spec = make_job(name, script, **kwargs)
        # Top-level keys before [env]; a remote job names its interpreter and an absolute workdir.
        remote = f'host = "{sshd_server.url}"\npython = "{sys.executable}"\nworkdir = "{spec.parent}"\n'
        spec.write_text(remote + spec.read_text())
        return spec

    return make


def test_ssh_an_unterminated_tqdm_redraw_is_read_while_it_waits(daemon: DaemonProcess, ssh_job, home: Path) -> None:
    gate = home / "never"  # the remote bar stays at 4/8: its "4/8" redraw is never terminated
    spec = ssh_job("crbar", CR_BAR_JOB, params=f', "{gate}"',
                   extra="[health]\nstall_floor_s = 2.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    check_redraw_read_while_it_waits(client, "crbar", seen_within_s=15)


def test_ssh_job_runs_with_progress_logs_and_done(daemon: DaemonProcess, ssh_job, daemon_env, home: Path,
                                                  sshd_server: SshServer) -> None:
    spec = ssh_job("remote", PROGRESS_JOB, params=', "10", "0.01"')
    out = supervise(daemon_env, "start", str(spec))
    assert "started remote attempt 1" in out.stdout
    client = daemon.client()
    wait_until(lambda: job_state(client, "remote") == "done")
    attempt = client.attempts("remote").attempts[0]
    assert attempt.exit_code == 0 and attempt.verdict == "done"
    assert attempt.host == sshd_server.url
    assert attempt.log_path == str(home / "remote-logs" / "remote" / "attempt-1.log")
    logs = supervise(daemon_env, "logs", "remote").stdout
    assert "10/10 [00:00<00:01, 5.0it/s]" in logs and "all good" in logs
    events = client.events("remote").events
    assert [e.data["done"] for e in events if e.kind == "progress"] == list(range(1, 11))
    assert [e.phase for e in events if e.kind == "phase"] == ["weight_loading", "running"]  # the bar implied the first
    assert {e.phase for e in events if e.kind == "progress"} == {"weight_loading"}


def test_ssh_crash_is_reported_with_its_traceback(daemon: DaemonProcess, ssh_job, daemon_env) -> None:
    spec = ssh_job("crashy", CRASHING_JOB,
                   extra="[restart]\nmax_attempts = 1\n")
    result = supervise(daemon_env, "start", str(spec), "--follow", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "KeyError: 'layers.0.weight_scale'" in result.stdout
    assert "crashy failed" in result.stdout
    attempt = daemon.client().attempts("crashy").attempts[0]
    assert attempt.exit_code == 1 and attempt.failure is not None


def test_ssh_stop_kills_escaped_grandchild(daemon: DaemonProcess, ssh_job, home: Path) -> None:
    pid_file = home / "grandchild.pid"
    script = escaping_job(pid_file)
    spec = ssh_job("escaper", script)
    client = daemon.client()
    client.start(str(spec), {})
    grandchild = int(wait_until(lambda: pid_file.exists() and pid_file.read_text()))
    gc = psutil.Process(grandchild)
    assert os.getpgid(grandchild) != client.status("escaper").jobs[0].attempt.pid
    response = client.stop("escaper", grace_s=1.0)
    assert grandchild in {p.pid for p in response.processes}
    assert not gc.is_running() or gc.status() == psutil.STATUS_ZOMBIE
    assert job_state(client, "escaper") == "stopped"


def test_dropped_connections_change_nothing_in_the_stored_events(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer, home: Path) -> None:
    client = daemon.client()
    gate = home / "gate"  # the job holds at 20/40 until the last drop is done
    spec = ssh_job("dropped", PROGRESS_JOB, params=f', "40", "0.03", "{gate}"')
    client.start(str(spec), {})
    job_pid = None

    def logins() -> int:
        return sshd_server.log_text().count("Accepted publickey")

    for at in (5, 12, 20):
        wait_until(lambda: progress_done(client, "dropped") >= at, timeout=30)  # noqa: B023
        job_pid = job_pid or client.status("dropped").jobs[0].attempt.pid
        before = logins()
        assert sshd_server.drop_connections() >= 1
        wait_until(lambda: logins() > before, timeout=30)  # noqa: B023 - the daemon is back
    gate.write_text("")
    wait_until(lambda: job_state(client, "dropped") == "done", timeout=30)
    interrupted = probe_events(client, "dropped")

    spec2 = ssh_job("steady", PROGRESS_JOB, params=f', "40", "0.03", "{gate}"')
    client.start(str(spec2), {})
    wait_until(lambda: job_state(client, "steady") == "done", timeout=30)
    uninterrupted = probe_events(client, "steady")

    assert interrupted == uninterrupted
    assert [d for _, _, d in interrupted if d is not None] == list(range(1, 41))
    attempts = client.attempts("dropped").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0
    assert "ssh connection lost" in daemon.log_text()


def test_daemon_sigkill_and_restart_readopts_the_remote_job(daemon: DaemonProcess, ssh_job, home: Path) -> None:
    gate = home / "gate"
    spec = ssh_job("steady", PROGRESS_JOB, params=f', "40", "0.02", "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "steady") >= 8)
    job_pid = client.status("steady").jobs[0].attempt.pid
    daemon.kill(signal.SIGKILL)
    assert psutil.Process(job_pid).status() != psutil.STATUS_ZOMBIE  # it runs on without its daemon
    daemon.start()
    client = daemon.client()
    wait_until(lambda: "re-adopted" in daemon.log_text())
    gate.write_text("")
    wait_until(lambda: job_state(client, "steady") == "done", timeout=30)
    events = probe_events(client, "steady")
    assert [d for _, _, d in events if d is not None] == list(range(1, 41))
    attempts = client.attempts("steady").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0


def test_a_changed_host_key_leaves_the_attempt_unreachable_and_it_is_readopted_when_the_key_is_right(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer, home: Path, tmp_path: Path) -> None:
    """The host's key is refused (rightly), but the job runs on there: its attempt is not ended
    on no evidence.  The job reads `unreachable` (with the refusal's reason) until the host is
    reached again, then the same attempt is re-adopted and judged by its real exit."""
    client = daemon.client()
    gate = home / "gate"
    spec = ssh_job("rekeyed", PROGRESS_JOB, params=f', "40", "0.03", "{gate}"')
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "rekeyed") >= 5, timeout=30)
    job_pid = client.status("rekeyed").jobs[0].attempt.pid
    good = sshd_server.known_hosts.read_text()
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, capture_output=True)
    entry, _, _ = good.partition(" ")
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    try:
        sshd_server.known_hosts.write_text(f"{entry} {kind} {key}\n")
        assert sshd_server.drop_connections() >= 1
        wait_until(lambda: job_state(client, "rekeyed") == "unreachable", timeout=60)
        job = client.status("rekeyed").jobs[0]
        assert "CHANGED" in (job.reason or ""), job.reason
        assert job.attempt.state == "running" and job.attempt.exit_code is None
        gate.write_text("")  # the job finishes on its own while the box cannot be reached
        wait_until(lambda: not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE,
                   timeout=30)
        assert job_state(client, "rekeyed") == "unreachable"  # no evidence of its end has been read
    finally:
        sshd_server.known_hosts.write_text(good)
    wait_until(lambda: job_state(client, "rekeyed") == "done", timeout=90)
    attempts = client.attempts("rekeyed").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0
    texts = [e.message for e in client.events("rekeyed").events]
    assert any("unreachable" in t for t in texts) and any("re-adopted" in t for t in texts), texts


def test_stop_while_the_host_is_unreachable_ends_the_wait_and_says_the_process_may_run_on(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer, home: Path, tmp_path: Path) -> None:
    client = daemon.client()
    spec = ssh_job("unreached", PROGRESS_JOB, params=f', "40", "0.03", "{home / "never"}"')
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "unreached") >= 3, timeout=30)
    good = sshd_server.known_hosts.read_text()
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, capture_output=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    try:
        sshd_server.known_hosts.write_text(f"{good.partition(' ')[0]} {kind} {key}\n")
        sshd_server.drop_connections()
        wait_until(lambda: job_state(client, "unreached") == "unreachable", timeout=60)
        out = supervise(daemon.env, "stop", "unreached", check=False)
        assert out.returncode == 69 and out.stderr.count("\n") == 1, out.stderr
        assert "cannot reach" in out.stderr and "again once the host answers" in out.stderr
        job = client.status("unreached").jobs[0]
        assert job.state == "stopped" and "may still run" in (job.reason or ""), job.reason
        assert job.attempt.state == "running"  # nothing says it ended: a later stop finds it
        pid = job.attempt.pid
        assert psutil.pid_exists(pid) and client.ping() is not None
    finally:
        sshd_server.known_hosts.write_text(good)
    out = supervise(daemon.env, "stop", "unreached", check=False)  # the host answers: the stop reaches it
    assert out.returncode == 0, out.stderr
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, timeout=20)
    assert client.status("unreached").jobs[0].attempt.state != "running"


def test_start_on_a_box_without_python3_exits_69_in_one_line_and_the_daemon_answers_on(
        daemon_env: dict[str, str], make_job: Callable[..., Path], home: Path, tmp_path: Path) -> None:
    from conftest import DaemonProcess
    from sshd import SshServer, without_python3

    with SshServer(tmp_path / "bare-sshd", extra_config=without_python3(tmp_path / "bare-box")) as box:
        env = {**daemon_env, **box.env()}
        spec = make_job("nopy", PROGRESS_JOB, params=', "3", "0.01"')
        spec.write_text(f'host = "{box.url}"\npython = "{sys.executable}"\nworkdir = "{spec.parent}"\n' + spec.read_text())
        daemon = DaemonProcess(home, env)
        daemon.start()
        try:
            result = supervise(env, "start", str(spec), check=False)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 69, (result.returncode, result.stderr)
            assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
            where = box.url.removeprefix("ssh://")
            assert lines[0] == (f"supervise: could not start nopy: no python3 on {where}: install Python 3.8 or newer "
                                "there, or set SUPERVISE_SSH_PYTHON to one (the supervisor's agent, which follows the "
                                "logs there, runs on it)")
            assert not (home / "remote-logs").exists()  # nothing launched there
            status = supervise(env, "status", "nopy", check=False)  # the daemon answers on, and says why
            assert status.returncode == 1 and "no python3 on" in status.stdout, status.stdout + status.stderr
            assert daemon.proc is not None and daemon.proc.poll() is None
            doctor = supervise(env, "doctor", "--host", box.url, check=False)
            assert doctor.returncode == 1
            assert any(line.startswith("MISSING  python3     no python3 on") for line in doctor.stdout.splitlines()), doctor.stdout
        finally:
            daemon.close()


# ---- no verdict on a remote attempt nobody could watch --------------------------------------
# A bar at 10 steps a second with a stall bound of 3 s: healthy throughout, so any `stalled`
# verdict is one taken on a clock that ran while its lines could not be read.
STEADY_HEALTH = "[health]\nstall_floor_s = 3\n[restart]\nmax_attempts = 2\n"


def _verdicts(client, job: str) -> list[str]:
    return [e.message for e in client.events(job, kinds=["verdict"]).events]


def _stored_log_offset(home: Path, job: str) -> int:
    """How far the daemon has read the attempt's log, as it stored it."""
    import sqlite3

    with sqlite3.connect(home / "supervise.db") as db:
        return int(db.execute("SELECT log_offset FROM attempts WHERE job=? ORDER BY n DESC", (job,)).fetchone()[0])


def test_a_remote_job_that_moved_while_the_daemon_was_down_is_read_before_it_is_judged(
        daemon: DaemonProcess, ssh_job) -> None:
    spec = ssh_job("moving", PROGRESS_JOB, params=', "120", "0.1"', extra=STEADY_HEALTH)
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "moving") >= 10, timeout=30)
    job_pid = client.status("moving").jobs[0].attempt.pid
    killed_at = time.time()
    daemon.kill(signal.SIGKILL)
    wait_until(lambda: time.time() - killed_at > 6.0)  # twice its stall bound, while it moves on
    daemon.start()
    up_at = time.time()
    client = daemon.client()
    wait_until(lambda: job_state(client, "moving") in ("done", "failed"), timeout=60)
    assert _verdicts(client, "moving") == ["done: exited 0"]
    attempts = client.attempts("moving").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0
    # The steps written while no daemon watched are stored with when they were written (by their
    # place in the remote log), not with when they were read.
    steps = {int(e.data["done"]): e.ts for e in client.events("moving", kinds=["progress"]).events}
    unwatched = [done for done, ts in steps.items() if killed_at < ts < up_at]
    assert len(unwatched) >= 20, sorted(steps.items())


def test_a_remote_job_is_unreachable_not_stalled_while_its_host_is_away(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer) -> None:
    spec = ssh_job("away", PROGRESS_JOB, params=', "200", "0.1"', extra=STEADY_HEALTH)
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "away") >= 10, timeout=30)
    job_pid = client.status("away").jobs[0].attempt.pid
    try:
        sshd_server.go_away()
        away_at = time.time()
        try:
            wait_until(lambda: job_state(client, "away") == "unreachable", timeout=20)
        except AssertionError:
            job = client.status("away").jobs[0]
            raise AssertionError(f"not unreachable 20 s into the outage: {job.state} ({job.reason}); "
                                 f"verdicts {_verdicts(client, 'away')}") from None
        wait_until(lambda: time.time() - away_at > 12.0)  # four stall bounds
        assert job_state(client, "away") == "unreachable" and _verdicts(client, "away") == []
        assert psutil.pid_exists(job_pid)  # it runs on there, untouched
    finally:
        sshd_server.come_back()
    wait_until(lambda: job_state(client, "away") in ("done", "failed"), timeout=90)
    assert _verdicts(client, "away") == ["done: exited 0"]
    attempts = client.attempts("away").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0
    assert progress_done(client, "away") == 200


def test_a_remote_job_that_ended_while_its_host_key_was_wrong_is_judged_by_its_exit_with_its_log_read(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer, home: Path, tmp_path: Path) -> None:
    spec = ssh_job("rekeyed", PROGRESS_JOB, params=', "80", "0.1"', extra=STEADY_HEALTH)
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "rekeyed") >= 10, timeout=30)
    attempt = client.status("rekeyed").jobs[0].attempt
    job_pid, log = attempt.pid, Path(attempt.log_path)
    good = sshd_server.known_hosts.read_text()
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, capture_output=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    try:
        sshd_server.known_hosts.write_text(f"{good.partition(' ')[0]} {kind} {key}\n")
        assert sshd_server.drop_connections() >= 1
        wait_until(lambda: job_state(client, "rekeyed") == "unreachable", timeout=60)
        # It finishes (exit 0) while the box cannot be reached, and its last line is older than its
        # stall bound by the time the key is put right.
        wait_until(lambda: not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE,
                   timeout=30)
        wait_until(lambda: time.time() - log.stat().st_mtime > 5.0)
    finally:
        sshd_server.known_hosts.write_text(good)
    wait_until(lambda: job_state(client, "rekeyed") in ("done", "failed"), timeout=90)
    assert _verdicts(client, "rekeyed") == ["done: exited 0"]
    attempts = client.attempts("rekeyed").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid and attempts[0].exit_code == 0  # not run again
    assert _stored_log_offset(home, "rekeyed") == log.stat().st_size  # read to its end
    assert progress_done(client, "rekeyed") == 80


def test_logs_follow_of_a_remote_job_goes_on_through_an_outage_of_its_host(
        daemon: DaemonProcess, ssh_job, sshd_server: SshServer, daemon_env) -> None:
    # The attempt is not judged while its box is away; a person following its log is not cut off.
    spec = ssh_job("shown", PROGRESS_JOB, params=', "150", "0.1"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "shown") >= 5, timeout=30)
    logs = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "logs", "shown", "-f"], env=daemon_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            sshd_server.go_away()
            time.sleep(8.0)  # longer than it takes to find the box cannot be reached
        finally:
            sshd_server.come_back()
        out, err = logs.communicate(timeout=120)
    finally:
        logs.kill()
    assert logs.returncode == 0, err
    steps = [line for line in out.splitlines() if "/150 [" in line]
    assert len(steps) == 150 and "all good" in out, out[-2000:]
