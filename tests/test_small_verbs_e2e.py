"""Small things the verbs say, through the real CLI and a real daemon: `jobs` with none, `report
--out` with a name it cannot write, Tab completion that never starts a daemon."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import DaemonProcess
from e2e_jobs import REPO, supervise


def test_jobs_with_none_says_so(daemon: DaemonProcess, daemon_env) -> None:
    out = supervise(daemon_env, "jobs").stdout
    assert out == "no jobs yet: `supervise start JOB`\n", out


def test_report_out_of_another_kind_is_a_usage_error_in_one_line(daemon: DaemonProcess, daemon_env,
                                                                 home: Path) -> None:
    result = supervise(daemon_env, "report", "nope", "--out", str(home / "x.jpg"), check=False)
    assert result.returncode == 2, result
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("supervise report: error: argument --out: ") and "FILE.png or FILE.html" in last, result.stderr
    assert not (home / "x.jpg").exists()
    assert daemon.client().ping().pid == daemon.proc.pid


def test_completion_of_job_names_never_starts_a_daemon(home: Path, daemon_env) -> None:
    # No daemon runs in this home: the names come from the specs only, and none is started.
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "jobs", "--names"], env=daemon_env,
                            capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    started = (home / "daemon.sock").exists() or (home / "daemon.log").exists()
    if started:  # what this test checks against: stopped, so that it is not left behind
        subprocess.run([sys.executable, "-m", "supervisor.cli", "daemon", "stop"], env=daemon_env,
                       capture_output=True, timeout=60, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr
    assert not started, "a Tab press started a daemon"


def test_attempts_of_a_sharded_job_name_each_attempts_shard_and_jobs_its_shards(daemon: DaemonProcess, daemon_env,
                                                                               home: Path) -> None:
    specs = home / "specs"
    specs.mkdir()
    spec = specs / "trio.toml"
    spec.write_text('name = "trio"\ncommand = ["{python}", "-c", "print(1)"]\nshards = 3\n')
    supervise(daemon_env, "start", str(spec), "--follow")
    attempts = daemon.client().attempts("trio").attempts
    table = supervise(daemon_env, "attempts", "trio").stdout.splitlines()
    assert table[0].split()[:2] == ["#", "shard"], table
    rows = {int(line.split()[0]): line.split()[1] for line in table[1:] if line[:3].strip().isdigit()}
    assert rows == {a.n: str(a.shard) for a in attempts} and len(rows) == 3, (rows, table)
    listed = supervise(daemon_env, "jobs").stdout
    assert "shards 3/3 done, 0 running, 0 failed" in listed and "attempt " not in listed, listed


def test_doctor_of_a_host_that_does_not_answer_is_one_line_exit_69(daemon_env) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "doctor", "--host", f"ssh://me@127.0.0.1:{port}"],
                            env=daemon_env, capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    took = time.monotonic() - began
    assert result.returncode == 69, result
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("MISSING  ssh ") and f"127.0.0.1:{port}" in lines[0], lines
    assert took < 10, took


def test_config_show_sees_a_file_written_after_the_daemon_started(daemon: DaemonProcess, daemon_env,
                                                                  home: Path) -> None:
    config = home / "config.toml"
    assert not config.exists()
    config.write_text("gpu_interval_s = 4\n")
    out = supervise(daemon_env, "config", "show").stdout
    assert f"config file: {config} (present)" in out, out
    assert "changed since the daemon started" in out, out
    assert "gpu_interval_s" in out and "from default" in out  # the values it runs with: the start's
