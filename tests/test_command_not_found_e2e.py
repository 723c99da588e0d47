"""A command that does not exist: refused at `start` where the daemon can look (a local job), else
named `command_not_found` at its first launch (a remote job; a local one that runs `after`
another) and never relaunched; the log says so in the wrapper's own line, with no exit-status
path in front.  Through a real daemon, locally and over a real sshd on loopback."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.core.errors import SpecError
from supervisor.core.events import FailureKind

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]  # the session-scoped sshd_server fixture


def _spec(home: Path, name: str, top: str, command: str = '["nosuch-command-xyz", "--flag"]') -> Path:
    directory = home / "specs"
    directory.mkdir(exist_ok=True)
    spec = directory / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "{name}"
        command = {command}
        probes = ["python"]
        {top}
        [env]
        SUPERVISE_HOME = "{home}"
        [restart]
        max_attempts = 3
        backoff_initial_s = 0.5
        backoff_jitter_s = 0
        """))
    return spec


@pytest.mark.parametrize("top, command, words", [
    ("", '["nosuch-command-xyz", "--flag"]', "command 'nosuch-command-xyz' not found on the PATH"),
    ('python = "/nonexistent/bin/python"', '["{python}", "-c", "pass"]', "command '/nonexistent/bin/python' not found"),
    ("", '["./not-here.sh"]', "command './not-here.sh' not found"),
])
def test_a_local_command_that_does_not_exist_is_refused_at_start(daemon: DaemonProcess, daemon_env, home: Path,
                                                                 top: str, command: str, words: str) -> None:
    spec = _spec(home, "missing", top, command)
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65, (result.returncode, result.stderr)
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    client = daemon.client()
    with pytest.raises(SpecError, match="not found"):  # the daemon's own check, not only the CLI's
        client.start(str(spec), {})
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid


def test_a_command_found_with_the_jobs_own_path_and_workdir_starts(daemon: DaemonProcess, daemon_env,
                                                                   home: Path) -> None:
    tools = home / "tools"
    tools.mkdir()
    script = tools / "hello.sh"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    spec = _spec(home, "found", f'workdir = "{tools}"', '["./hello.sh"]')
    supervise(daemon_env, "start", str(spec))
    spec = _spec(home, "onpath", "", '["hello.sh"]')
    spec.write_text(spec.read_text().replace("[env]\n", f'[env]\nPATH = "{tools}:/usr/bin:/bin"\n'))
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "found") == "done" and job_state(client, "onpath") == "done", timeout=30)


def _assert_named_and_not_relaunched(client, job: str, log_text: str) -> None:
    attempts = client.attempts(job).attempts
    assert len(attempts) == 1, attempts  # never relaunched, though max_attempts = 3
    assert attempts[0].exit_code == 127
    status = client.status(job).jobs[0]
    assert status.state == "failed" and "command was not found" in status.reason, status.reason
    failures = client.events(job, kinds=["failure"]).events
    assert [f.failure.kind for f in failures if f.failure] == [FailureKind.COMMAND_NOT_FOUND], failures
    assert "supervise: command not found: " in log_text
    assert ".exit" not in log_text, log_text  # once every shell message began with the exit-status path


def test_a_local_command_missing_at_launch_is_command_not_found_and_not_relaunched(
        daemon: DaemonProcess, daemon_env, home: Path) -> None:
    # Runs after `first`, which might have installed it: not checked at start, found missing at launch.
    first = _spec(home, "first", "", '["true"]')
    client = daemon.client()
    supervise(daemon_env, "start", str(first))
    wait_until(lambda: job_state(client, "first") == "done", timeout=30)
    later = _spec(home, "later", 'after = ["first"]', f'["{home}/never-installed"]')
    supervise(daemon_env, "start", str(later))
    wait_until(lambda: job_state(client, "later") == "failed", timeout=30)
    log_path = client.attempts("later").attempts[0].log_path
    _assert_named_and_not_relaunched(client, "later", Path(log_path).read_text())


@pytest.fixture
def ssh_daemon_env(daemon_env: dict[str, str], sshd_server: SshServer, home: Path) -> dict[str, str]:
    env = dict(daemon_env)
    env.update(sshd_server.env())
    env["SUPERVISE_SSH_LOG_ROOT"] = str(home / "remote-logs")
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env


def test_a_remote_command_that_does_not_exist_is_command_not_found_at_first_launch(
        home: Path, ssh_daemon_env: dict[str, str], sshd_server: SshServer) -> None:
    daemon = DaemonProcess(home, ssh_daemon_env)
    daemon.start()
    try:
        spec = _spec(home, "remote", f'host = "{sshd_server.url}"\npython = "/nonexistent/bin/python"\n'
                                     f'workdir = "{home}"', '["{python}", "-c", "pass"]')
        supervise(ssh_daemon_env, "start", str(spec))  # the daemon cannot look on the box before launching
        client = daemon.client()
        wait_until(lambda: job_state(client, "remote") == "failed", timeout=60)
        log = json.loads(supervise(ssh_daemon_env, "attempts", "remote", "--json").stdout)["attempts"][0]["log_path"]
        _assert_named_and_not_relaunched(client, "remote", Path(log).read_text())
        assert "/nonexistent/bin/python" in Path(log).read_text()
    finally:
        daemon.stop()


def test_a_missing_workdir_is_a_spec_error_65_in_one_line_and_nothing_is_stored(daemon, home: Path,
                                                                              daemon_env: dict[str, str]) -> None:
    spec = home / "nowhere.toml"
    spec.write_text('name = "nowhere"\ncommand = ["true"]\nworkdir = "/nonexistent/dir"\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65, (result.returncode, result.stderr)  # was 69, as if the host were down
    assert result.stderr.count("\n") == 1 and "field 'workdir'" in result.stderr and "/nonexistent/dir" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid
