"""A job with a host pool (`hosts = [...]`, one shard) through a real daemon, a real sshd on
loopback and real processes: it starts on the pool's first host; its attempt there is killed by a
SIGKILL nobody here sent (a host-level verdict), so the relaunch moves to the pool's next host,
the move is said (an action event and the alert's next step), the host is quarantined (one strike
here, `quarantine_strikes = 1`) and listed with its expiry; `host` beside `hosts` is refused; a
pool host where nothing listens is passed over at launch for the next."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]

JOB = """import os, sys, time, pathlib
out, n = pathlib.Path(sys.argv[1]), sys.argv[2]
(out / f'pid-{n}').write_text(str(os.getpid()))
print('working', flush=True)
if n == '1':
    time.sleep(120)
"""


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], sshd_server: SshServer, home: Path) -> dict[str, str]:
    env = dict(daemon_env)
    env.update(sshd_server.env())
    env["SUPERVISE_SSH_LOG_ROOT"] = str(home / "remote-logs")
    env["HOME"] = str(home)
    env["SUPERVISE_QUARANTINE_STRIKES"] = "1"
    env["SUPERVISE_SSH_RETRY_S"] = "2"  # a pool host that does not answer is given up on soon
    # An alert is stored as an event only where a URL is set: one on loopback where nothing listens.
    env["SUPERVISE_ALERT_URLS"] = "json://127.0.0.1:9/unused"
    env.pop("SSH_AUTH_SOCK", None)
    return env


def test_a_killed_attempt_moves_the_relaunch_to_the_next_host_of_the_pool(
        daemon: DaemonProcess, sshd_server: SshServer, home: Path, daemon_env: dict[str, str]) -> None:
    (home / "job.py").write_text(JOB)
    spec = home / "pool.toml"
    spec.write_text(f'name = "pool"\nhosts = ["{sshd_server.url}", "local"]\npython = "{sys.executable}"\n'
                    f'workdir = "{home}"\ncommand = ["{{python}}", "job.py", "{home}", "{{attempt}}"]\n'
                    "stop_grace_s = 1\n[restart]\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: (home / "pid-1").exists() and (home / "pid-1").read_text())
    assert client.attempts("pool").attempts[0].host == sshd_server.url  # the pool's first host
    os.kill(int((home / "pid-1").read_text()), signal.SIGKILL)  # as an outside OOM killer or a node agent would
    wait_until(lambda: job_state(client, "pool") in ("done", "failed"), timeout=60)
    first, second = client.attempts("pool").attempts
    assert (first.verdict, first.host, second.verdict, second.host) == ("killed", sshd_server.url, "done", "local")
    moves = [e for e in client.events("pool", kinds=["action"]).events if e.data.get("moved_to")]
    assert [e.message for e in moves] == [f"moved from {sshd_server.url} to local: the last attempt there was "
                                          "killed (a SIGKILL nobody here sent)"]
    alert = wait_until(lambda: next((e for e in client.events("pool", kinds=["alert"]).events
                                     if e.message == "pool: attempt 1 killed"), None))
    assert alert.data["next"] == (f"relaunch in 0.0s; moving from {sshd_server.url} to local (the last attempt "
                                  "there was killed (a SIGKILL nobody here sent))")
    [held] = client.quarantine().quarantined
    assert (held.place, held.reason, held.until - held.since) == (sshd_server.url, "the last attempt there ended "
                                                                                   "killed", 900.0)
    # `attempts` shows each attempt's host once they differ.
    shown = supervise(daemon_env, "attempts", "pool").stdout.splitlines()
    assert f"     host: {sshd_server.url}" in shown and "     host: local" in shown, shown

    # `host` beside a pool: a spec error in one line, exit 65, the daemon answers on.
    spec = home / "both.toml"
    spec.write_text('name = "both"\nhost = "ssh://box"\nhosts = ["ssh://a", "ssh://b"]\npython = "/usr/bin/python3"\n'
                    'workdir = "/tmp"\ncommand = ["true"]\n')
    done = supervise(daemon_env, "start", str(spec), check=False)
    assert done.returncode == 65, done
    assert "`host` ('ssh://box') and `hosts` both set: with one shard `hosts` is a pool" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and daemon.client().ping()


def test_a_pool_host_that_does_not_answer_at_launch_is_passed_over_for_the_next(
        daemon: DaemonProcess, home: Path) -> None:
    (home / "job.py").write_text(JOB)
    with socket.socket() as probe:  # a loopback port where nothing listens: the connection is refused
        probe.bind(("127.0.0.1", 0))
        dead = f"ssh://nobody@127.0.0.1:{probe.getsockname()[1]}"
    spec = home / "pool2.toml"
    spec.write_text(f'name = "pool2"\nhosts = ["{dead}", "local"]\npython = "{sys.executable}"\n'
                    f'workdir = "{home}"\ncommand = ["{{python}}", "job.py", "{home}", "2"]\n'
                    "[restart]\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "pool2") in ("done", "failed"), timeout=90)
    assert job_state(client, "pool2") == "done", client.status("pool2").jobs[0].reason
    [only] = client.attempts("pool2").attempts  # nothing was launched where nothing listens
    assert (only.host, only.verdict) == ("local", "done")
    moves = [e.message for e in client.events("pool2", kinds=["action"]).events if e.data.get("moved_to")]
    assert moves == [f"moved from {dead} to local: connection refused ({dead.removeprefix('ssh://')})"]
    assert [q.place for q in client.quarantine().quarantined] == [dead]  # one strike here (quarantine_strikes = 1)
