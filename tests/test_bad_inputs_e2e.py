"""Bad specs given to a real daemon: one line, exit 65 (HTTP 422), nothing stored, the daemon alive."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from conftest import DaemonProcess
from e2e_jobs import supervise

from supervisor.cli.client import Client
from supervisor.core.errors import SpecError


def test_a_fifo_spec_does_not_freeze_the_daemon(daemon: DaemonProcess, home: Path) -> None:
    fifo = home / "fifo.toml"
    os.mkfifo(fifo)
    client = Client(daemon.paths, timeout_s=10)
    try:
        with pytest.raises(SpecError, match="not a regular file") as info:
            client.start(str(fifo), {})  # straight to the daemon, not through the CLI's own check
        assert "\n" not in str(info.value)
        assert client.ping().pid == daemon.proc.pid
    finally:
        client.close()
        with contextlib.suppress(OSError):  # were the daemon blocked on it, a writer releases it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_deeply_nested_toml_and_unlaunchable_env_are_one_line(daemon: DaemonProcess, home: Path,
                                                              daemon_env: dict[str, str]) -> None:
    nested = home / "nested.toml"
    nested.write_text('command = ["x"]\nparams = ' + "[" * 500 + "]" * 500 + "\n")
    client = daemon.client()
    with pytest.raises(SpecError, match="nested too deeply") as info:  # was a 500 with a traceback
        client.start(str(nested), {})
    assert "\n" not in str(info.value)
    result = supervise(daemon_env, "start", str(nested), check=False)  # was a 3,000-line traceback
    assert result.returncode == 65 and result.stderr.count("\n") == 1 and "nested too deeply" in result.stderr
    env_key = home / "envkey.toml"
    env_key.write_text('command = ["true"]\n[env]\n"A=B" = "1"\n')
    with pytest.raises(SpecError, match="environment variable name"):  # raised inside launch before
        client.start(str(env_key), {})
    assert client.status().jobs == []  # nothing stored, nothing launched
    assert client.ping().pid == daemon.proc.pid


@pytest.mark.parametrize("value", ["-1", "0", "nan", '"soon"', "1e300", "[1]"])
def test_a_bad_learned_min_is_one_line_exit_65_and_nothing_stored(daemon: DaemonProcess, home: Path,
                                                                   daemon_env: dict[str, str], value: str) -> None:
    spec = home / "lm.toml"
    spec.write_text(f'name = "lm"\ncommand = ["true"]\n[health]\nlearned_min_s = {value}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "health.learned_min_s" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid


def test_a_learned_min_that_can_never_tighten_is_noted_at_start(daemon: DaemonProcess, home: Path,
                                                                  daemon_env: dict[str, str]) -> None:
    spec = home / "lm.toml"
    spec.write_text('name = "lm"\ncommand = ["true"]\n[health]\nstall_floor_s = 30\nlearned_min_s = 45\n')
    out = supervise(daemon_env, "start", str(spec)).stdout
    [note] = [line for line in out.splitlines() if "never applies" in line]
    assert "health.learned_min_s (45s) is not under the stall floor (30s)" in note


@pytest.mark.parametrize("line,field", [
    ("hung_s = -1", "hung_s"), ("hung_s = \"soon\"", "hung_s"), ("diverge_k = 1", "diverge_k"),
    ("diverge_k = nan", "diverge_k"), ("diverge_steps = 0", "diverge_steps"), ("diverge_steps = 1e9", "diverge_steps"),
    ("hung_action = \"explode\"", "hung_action"), ("diverge_action = 3", "diverge_action"),
    ("idle_s = 0", "idle_s"), ("idle_s = inf", "idle_s"), ("idle_action = \"nap\"", "idle_action"),
    ("slow_floor_s = 0", "slow_floor_s"), ("slow_floor_s = -3", "slow_floor_s"), ("slow_floor_s = nan", "slow_floor_s"),
    ("slow_floor_s = \"soon\"", "slow_floor_s"), ("slow_floor_s = 1e300", "slow_floor_s"),
])
def test_bad_hung_and_divergence_fields_are_one_line_exit_65_and_nothing_stored(
        daemon: DaemonProcess, home: Path, daemon_env: dict[str, str], line: str, field: str) -> None:
    spec = home / "hd.toml"
    spec.write_text(f'name = "hd"\ncommand = ["true"]\n[health]\n{line}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert f"health.{field}" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid


@pytest.mark.parametrize(("line", "said"), [
    ('kill_signal_first = "SIGFOO"', "kill_signal_first"),
    ('kill_signal_first = "SIGKILL"', "kill_signal_first"),
    ('kill_signal_first = 10', "kill_signal_first"),
    ('kill_signal_first = "USR1"\ncheckpoint_grace_s = -1', "checkpoint_grace_s"),
    ('kill_signal_first = "USR1"\ncheckpoint_grace_s = inf', "checkpoint_grace_s"),
    ('checkpoint_grace_s = 30', "checkpoint_grace_s"),
    ('kill_signal_first = "USR1"\nhost = "someone@gpu-box"\npython = "/usr/bin/python3"\nworkdir = "/tmp"',
     "kill_signal_first"),
])
def test_bad_first_signal_fields_are_one_line_exit_65_and_nothing_stored(
        daemon: DaemonProcess, home: Path, daemon_env: dict[str, str], line: str, said: str) -> None:
    spec = home / "ks.toml"
    spec.write_text(f'name = "ks"\ncommand = ["true"]\n{line}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid


@pytest.mark.parametrize("line", ["max_runtime = -1", "max_runtime = 0", "max_runtime = inf", 'max_runtime = "2h"',
                                  "max_runtime = 1e12", "max_runtime = true"])
def test_a_bad_max_runtime_is_one_line_exit_65_and_nothing_stored(
        daemon: DaemonProcess, home: Path, daemon_env: dict[str, str], line: str) -> None:
    spec = home / "mr.toml"
    spec.write_text(f'name = "mr"\ncommand = ["true"]\n{line}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "max_runtime" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid
