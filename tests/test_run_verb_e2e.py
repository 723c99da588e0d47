"""`supervise run NAME -- CMD ARGS...`: a job without a spec file of the user's, through the real
CLI and a real daemon: started where it was typed, its arguments literal, judged and relaunched as
any job, and bad values refused in one line with nothing stored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonProcess

from supervisor.core.config import Paths


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def test_run_supervises_a_command_line_as_a_job(daemon: DaemonProcess, daemon_env, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("from the working directory\n")
    result = cli(daemon_env, tmp_path, "run", "cat-it", "--follow", "--", sys.executable, "-c",
                 "print(open('data.txt').read().strip(), '{x}', flush=True)")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cat-it done: exited 0" in result.stdout
    client = daemon.client()
    [attempt] = client.attempts("cat-it").attempts
    assert Path(attempt.log_path).read_text() == "from the working directory {x}\n"  # where typed; literal braces
    assert "cat-it" in cli(daemon_env, tmp_path, "jobs").stdout


def test_a_run_job_is_judged_and_relaunched_as_any_job(daemon: DaemonProcess, daemon_env, tmp_path: Path) -> None:
    code = "print('step 0', flush=True); raise KeyError('layers.0.weight_scale')"
    result = cli(daemon_env, tmp_path, "run", "crashy", "--follow", "--", sys.executable, "-c", code)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "same failure twice in a row" in result.stdout and "key_error: KeyError" in result.stdout, result.stdout
    assert [a.verdict for a in daemon.client().attempts("crashy").attempts] == ["crashed", "crashed"]


@pytest.mark.parametrize("args, words", [
    (["run", "nothing"], "no command to run"),
    (["run", "nothing", "--"], "no command to run"),
    (["run", "../up", "--", "true"], "argument name: a job name is"),
    (["run", "gpus", "--gpus", "0,x", "--", "true"], "argument --gpus: expected GPU indices"),
    (["run", "gpus", "--gpus", "1,1", "--", "true"], "distinct GPU indices"),
    (["run", "stray", "extra", "--", "true"], "unexpected 'extra' before `--`"),  # was dropped: `true` ran
])
def test_bad_run_values_are_one_line_exit_2_and_nothing_stored(daemon: DaemonProcess, daemon_env, tmp_path: Path,
                                                               args: list[str], words: str) -> None:
    result = cli(daemon_env, tmp_path, *args)
    assert result.returncode == 2 and result.stdout == "", result
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("supervise run: error: ") and words in last, result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid
    assert not (Paths(Path(daemon_env["SUPERVISE_HOME"])).state_dir / "run").exists()


def test_a_command_that_cannot_run_is_65_in_one_line(daemon: DaemonProcess, daemon_env, tmp_path: Path) -> None:
    result = cli(daemon_env, tmp_path, "run", "typo", "--", "no-such-program-here", "x")
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "no-such-program-here" in result.stderr
    assert daemon.client().status().jobs == []
    assert not _run_file(daemon_env, "typo").exists()  # a refused run leaves no file of its own behind


def _run_file(env: dict[str, str], name: str) -> Path:
    return Paths(Path(env["SUPERVISE_HOME"])).state_dir / "run" / f"{name}.toml"


def test_a_run_refused_because_the_job_runs_leaves_its_file_as_it_was(daemon: DaemonProcess, daemon_env,
                                                                      tmp_path: Path) -> None:
    result = cli(daemon_env, tmp_path, "run", "busy", "--", sys.executable, "-c", "import time; time.sleep(60)")
    assert result.returncode == 0, result.stderr
    written = _run_file(daemon_env, "busy").read_text()
    again = cli(daemon_env, tmp_path, "run", "busy", "--", sys.executable, "-c", "print('another command')")
    assert again.returncode == 75 and again.stderr.count("\n") == 1, again.stderr
    # The running job's file still says what it runs: a restart finds nothing edited, and a
    # --reload would not take a command that was refused.
    assert _run_file(daemon_env, "busy").read_text() == written
    restarted = cli(daemon_env, tmp_path, "restart", "busy", "--grace", "1")
    assert restarted.returncode == 0 and "changed since" not in restarted.stdout + restarted.stderr, restarted
    cli(daemon_env, tmp_path, "stop", "busy", "--grace", "1")


def test_start_of_a_program_suggests_run(daemon: DaemonProcess, daemon_env, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    result = cli(daemon_env, tmp_path, "start", "train.py")
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "`supervise run train -- python train.py`" in result.stderr, result.stderr
    # As a path too: it was read as a TOML spec and refused as "not valid TOML".
    result = cli(daemon_env, tmp_path, "start", "./train.py")
    assert result.returncode == 65 and "`supervise run train -- python ./train.py`" in result.stderr, result.stderr
    script = tmp_path / "fine tune.sh"
    script.write_text("#!/bin/sh\necho tuning\n")
    result = cli(daemon_env, tmp_path, "start", str(script))
    assert result.returncode == 65 and f"`supervise run fine-tune -- {script}`" in result.stderr, result.stderr
    assert daemon.client().status().jobs == []
