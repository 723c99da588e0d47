"""Bad specs given to a real daemon: one line, exit 65 (HTTP 422), nothing stored, the daemon alive."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from conftest import DaemonProcess
from e2e_jobs import supervise

from supervisor.client import Client
from supervisor.errors import SpecError


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
