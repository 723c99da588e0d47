"""`host = "slurm+ssh://user@login-node"`: Slurm's commands run on a login node over SSH.

The login node is a real sshd on loopback (tests/sshd.py) whose sessions see the real
single-node Slurm of tests/slurm.py (``SetEnv SLURM_CONF``); the daemon itself is given no
SLURM_CONF, so every sbatch/squeue/scontrol/scancel it runs has to go through SSH.  Through a
real daemon: submit, follow and exit; a crash relaunched and stopped on the same failure twice;
bad URLs refused in one line with exit 65, the daemon alive.  On the host itself: a log root
the daemon cannot see is followed over SSH (the agent) and the exit file read there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import CRASHING_JOB, PROGRESS_JOB, job_state, progress_done, scheduler_ids, supervise

from supervisor.hosts.base import LaunchRequest

if TYPE_CHECKING:
    from slurm import SlurmCluster
    from sshd import SshServer

pytest_plugins = ["slurm", "sshd"]


@pytest.fixture(scope="module")
def login_node(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    from sshd import SshServer  # the plugin module, imported (and assertion-rewritten) by now

    config = "".join(f"SetEnv {k}={v}\n" for k, v in slurm_cluster.env().items())
    with SshServer(tmp_path_factory.mktemp("login") / "sshd", extra_config=config) as server:
        yield server


@pytest.fixture
def url(login_node: SshServer) -> str:
    return "slurm+ssh" + login_node.url[len("ssh"):]


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], login_node: SshServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in daemon_env.items() if not k.startswith("SLURM")}
    env.update(login_node.env())
    env.update({"SUPERVISE_SLURM_LOG_ROOT": str(home / "shared-logs"), "SUPERVISE_SLURM_POLL_S": "0.2",
                "HOME": str(home)})
    env.pop("SSH_AUTH_SOCK", None)
    return env


@pytest.fixture
def job(make_job: Callable[..., Path], url: str) -> Callable[..., Path]:
    def make(name: str, script: str, **kwargs: str) -> Path:
        spec = make_job(name, script, **kwargs)
        spec.write_text(f'host = "{url}"\npython = "{sys.executable}"\nworkdir = "{spec.parent}"\n'
                        + spec.read_text())
        return spec

    return make


def test_slurm_over_ssh_job_is_submitted_followed_and_done(daemon: DaemonProcess, job, home: Path, url: str,
                                                           daemon_env: dict[str, str],
                                                           slurm_cluster: SlurmCluster) -> None:
    spec = job("ss-done", PROGRESS_JOB, params=', "10", "0.01"', extra='[slurm]\ntime = "5"\n')
    out = supervise(daemon_env, "start", str(spec))
    assert "started ss-done attempt 1" in out.stdout
    client = daemon.client()
    wait_until(lambda: job_state(client, "ss-done") == "done", timeout=40)
    attempt = client.attempts("ss-done").attempts[0]
    assert attempt.exit_code == 0 and attempt.verdict == "done" and attempt.host == url
    assert attempt.log_path == str(home / "shared-logs" / "ss-done" / "attempt-1.log")
    [job_id] = scheduler_ids(home, "ss-done")
    assert job_id is not None and slurm_cluster.job_field(job_id, "JobState") == "COMPLETED"
    assert slurm_cluster.job_field(job_id, "TimeLimit") == "00:05:00"  # the [slurm] table reached sbatch
    assert progress_done(client, "ss-done") == 10


def test_slurm_over_ssh_crash_is_relaunched_then_stopped_on_the_same_failure_twice(
        daemon: DaemonProcess, job, home: Path) -> None:
    spec = job("ss-crash", CRASHING_JOB, extra="[restart]\nmax_attempts = 5\nbackoff_initial_s = 0.1\n"
                                               "backoff_jitter_s = 0\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "ss-crash") == "failed", timeout=40)
    attempts = client.attempts("ss-crash").attempts
    assert [a.verdict for a in attempts] == ["crashed", "crashed"]
    assert all(a.exit_code == 1 for a in attempts)
    assert "same failure twice" in (client.status("ss-crash").jobs[0].reason or "")
    ids = scheduler_ids(home, "ss-crash")
    assert len(set(ids)) == 2 and None not in ids


@pytest.mark.parametrize(("host", "says"), [
    ("slurm+ssh://", "no login node named"),
    ("slurm+ssh://user@", "no login node named"),
    ("slurm+ssh://login:99999", "bad port"),
    ("slurm+ssh://login:port", "bad port"),
    ("slurm+ssh://login/some/path", "no path"),
    ("slurm+ssh://login?colour=red", "unknown option colour"),
])
def test_bad_slurm_over_ssh_urls_are_refused_in_one_line(daemon: DaemonProcess, make_job, host: str, says: str,
                                                         daemon_env: dict[str, str]) -> None:
    spec = make_job("ss-bad", PROGRESS_JOB, params=', "1", "0.01"')
    spec.write_text(f'host = "{host}"\npython = "{sys.executable}"\nworkdir = "{spec.parent}"\n' + spec.read_text())
    out = supervise(daemon_env, "start", str(spec), check=False)
    assert out.returncode == 65, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "slurm+ssh://" in lines[0], lines
    assert daemon.client().ping()  # still serving


def test_a_log_root_the_daemon_cannot_see_is_followed_over_ssh(
        login_node: SshServer, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.hosts.slurm.ssh import SlurmSshHost

    for key, value in {**login_node.env(), "HOME": str(tmp_path), "SUPERVISE_SLURM_POLL_S": "0.2",
                       "SUPERVISE_SLURM_LOG_ROOT": str(tmp_path / "logs")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    host = SlurmSshHost(url, shared=False)  # as if the log root were on the login node only

    async def go() -> tuple[list[str], int | None]:
        try:
            log_path, status_path = await host.log_paths("remote", 1)
            code = "import sys\nfor i in range(5): print(f'line {i}', flush=True)\nsys.exit(3)\n"
            handle = await host.launch(LaunchRequest(
                argv=[sys.executable, "-c", code], workdir=str(tmp_path), env={"PYTHONUNBUFFERED": "1"},
                log_path=log_path, status_path=status_path, tag="ss.remote.1"))
            follower = host.follow(log_path, 0)
            lines: list[str] = []

            async def read() -> None:
                async for batch in follower.records():
                    lines.extend(r.text for r in batch)

            reader = asyncio.create_task(read())
            status = await asyncio.wait_for(host.wait_exit(handle), 60)
            follower.finish()
            await asyncio.wait_for(reader, 30)
            return lines, status.returncode
        finally:
            await host.close()

    lines, code = asyncio.run(go())
    assert [line for line in lines if line.startswith("line")] == [f"line {i}" for i in range(5)]
    assert code == 3
    assert host.ssh.mux.channels == 1  # the log came through the SSH host's agent
    assert os.environ.get("SLURM_CONF") is None  # so sbatch could only have run over SSH
