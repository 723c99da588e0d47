"""Stacks before the kill: a real stuck job (a thread in `frozen_here()`, and a child process
blocked in `child_frozen_here()`) judged stalled through a real daemon; py-spy's dump of both is
stored with the verdict, shown by `status` and in the alert's evidence, and `supervise stack`
dumps a running job on demand.  Without py-spy: one line, and the kill goes on."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.cli.client import Client
from supervisor.hosts import stacks

STUCK_JOB = """\
import subprocess, sys, threading, time
CHILD = "import time\\ndef child_frozen_here():\\n    time.sleep(3600)\\nchild_frozen_here()\\n"
child = subprocess.Popen([sys.executable, "-c", CHILD])
def frozen_here(gate):
    gate.wait()
for i in range(1, 4):
    print(f"Loading checkpoint shards: {i * 10}%|###| {i}/10 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
frozen_here(threading.Event())
"""


def _stacks_events(client: Client, job: str) -> list[dict]:
    return [e.data for e in client.events(job).events if e.kind == "stacks"]


def test_a_stalled_job_s_stacks_name_where_it_hung_before_the_kill(daemon: DaemonProcess, make_job: Callable[..., Path],
                                                                    daemon_env: dict[str, str]) -> None:
    spec = make_job("stuck", STUCK_JOB, extra="[health]\nstall_floor_s = 8\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("stuck").jobs[0].attempt is not None
               and client.status("stuck").jobs[0].attempt.phase is not None, timeout=30)
    # On demand, while it runs: both processes' stacks, each naming where it waits.
    # (the CLI call that saw them is the one checked: on a loaded machine a second could come after the kill)
    seen = []

    def dumped_both() -> bool:
        seen.append(supervise(daemon_env, "stack", "stuck", check=False))
        return "child_frozen_here" in seen[-1].stdout

    wait_until(dumped_both, timeout=20)
    out = seen[-1]
    assert out.returncode == 0 and "frozen_here" in out.stdout and "child_frozen_here" in out.stdout, out.stdout
    wait_until(lambda: job_state(client, "stuck") == "failed", timeout=60)
    events = client.events("stuck").events
    kinds = [e.kind for e in events]
    assert "stacks" in kinds and kinds.index("stacks") < next(
        i for i, e in enumerate(events) if e.kind == "action" and "killed the process tree" in e.message)
    dumped = _stacks_events(client, "stuck")[0]["processes"]
    texts = [p["stack"] or "" for p in dumped]
    assert any("frozen_here" in t and "child_frozen_here" not in t for t in texts)
    assert any("child_frozen_here" in t for t in texts)
    status = client.status("stuck").jobs[0]
    assert status.stacks is not None and "frozen_here" in status.stacks
    assert "frozen_here" in supervise(daemon_env, "status", "stuck", check=False).stdout
    shown = supervise(daemon_env, "events", "stuck", "--kind", "stacks", check=False)
    assert shown.returncode == 0 and "frozen_here" in shown.stdout and "child_frozen_here" in shown.stdout, shown.stdout


def test_without_py_spy_one_line_says_so_and_the_kill_goes_on(home: Path, daemon_env: dict[str, str],
                                                               make_job: Callable[..., Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    daemon_env["SUPERVISE_PYSPY"] = str(home / "no-such-py-spy")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        spec = make_job("nospy", STUCK_JOB, extra="[health]\nstall_floor_s = 2\n[restart]\nmax_attempts = 1\n")
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: job_state(client, "nospy") == "failed", timeout=60)
        stacks = [e.message for e in client.events("nospy").events if e.kind == "stacks"]
        assert len(stacks) == 1 and "py-spy not found" in stacks[0], stacks
        attempt = client.attempts("nospy").attempts[0]
        assert attempt.verdict == "stalled" and attempt.exit_signal is not None  # killed all the same
    finally:
        daemon.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_where_ptrace_is_refused_one_line_names_the_pids_and_the_kill_goes_on(
        home: Path, daemon_env: dict[str, str], make_job: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The real refusal: the real py-spy run as nobody against the job's processes (root's) is
    refused by the kernel, as it is for a daemon that does not run as the job's user."""
    pyspy = stacks.find_pyspy()
    assert pyspy is not None
    wrapper = home / "py-spy-as-nobody"
    wrapper.write_text(f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups -- {pyspy} "$@"\n')
    wrapper.chmod(0o755)
    daemon_env["SUPERVISE_PYSPY"] = str(wrapper)
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        spec = make_job("noptrace", STUCK_JOB, extra="[health]\nstall_floor_s = 8\n[restart]\nmax_attempts = 1\n")
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: "is not running" not in client.stacks("noptrace").message
                   and len(client.stacks("noptrace").processes) >= 3, timeout=20)  # wrapper, job, its child
        out = supervise(daemon_env, "stack", "noptrace", check=False)
        first = out.stdout.splitlines()[0]
        assert out.returncode == 1 and "could not attach to pid" in first and "permission denied (ptrace)" in first \
            and "run the daemon as the job's user or as root" in first, out.stdout
        wait_until(lambda: job_state(client, "noptrace") == "failed", timeout=60)
        lines = [e.message for e in client.events("noptrace").events if e.kind == "stacks"]
        assert len(lines) == 1 and "\n" not in lines[0] and "permission denied (ptrace)" in lines[0], lines
        attempt = client.attempts("noptrace").attempts[0]
        assert attempt.verdict == "stalled" and attempt.exit_signal is not None  # killed all the same
    finally:
        daemon.close()


def test_stack_of_an_unknown_or_idle_job_is_one_line(daemon: DaemonProcess, make_job: Callable[..., Path],
                                                     daemon_env: dict[str, str]) -> None:
    out = supervise(daemon_env, "stack", "nosuchjob", check=False)
    assert out.returncode == 66 and out.stderr.count("\n") == 1, (out.returncode, out.stderr)
    spec = make_job("quick", "print('hi')\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "quick") == "done", timeout=30)
    out = supervise(daemon_env, "stack", "quick", check=False)
    assert out.returncode == 1 and "is not running" in out.stdout and out.stdout.count("\n") == 1, out.stdout
    for bad in ("x%00", "..", "a" * 300):
        assert client._http.get(f"/v1/jobs/{bad}/stacks").status_code in (400, 404)
    assert client.ping().pid == daemon.proc.pid


def test_a_stopped_process_is_read_as_it_stands(tmp_path: Path) -> None:
    """A SIGSTOPped process (a frozen rank, Ctrl-Z) cannot be paused again by py-spy: its memory
    is read without pausing, and its stack still names where it stopped."""
    import asyncio
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time\ndef stopped_in_here():\n    time.sleep(60)\n"
                                                   "stopped_in_here()\n"])
    try:
        wait_until(lambda: "stopped_in_here" in (asyncio.run(stacks.dump([proc.pid], 10)).processes[0].stack or ""))
        proc.send_signal(signal.SIGSTOP)
        dump = asyncio.run(stacks.dump([proc.pid], 10))
        assert "stopped_in_here" in (dump.processes[0].stack or ""), dump
    finally:
        proc.kill()
        proc.wait()


MANY_CHILDREN = """\
import subprocess, sys, time
# A launcher's children: each repeats its secret flag (as torchrun's workers repeat the script's argv).
children = [subprocess.Popen(["/bin/sh", "-c", "sleep 600; :", "sh", sys.argv[1]]) for _ in range(70)]
print("launched", len(children), flush=True)
def waiting_for_workers():
    time.sleep(600)
waiting_for_workers()
"""


def test_a_dump_says_how_many_processes_it_left_out_and_shows_no_secret_flag(
        daemon: DaemonProcess, make_job: Callable[..., Path], daemon_env: dict[str, str]) -> None:
    secret = "hf_plantedSecret0123456789"
    spec = make_job("many", MANY_CHILDREN, params=f', "--hf-token={secret}"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: "launched" in supervise(daemon_env, "logs", "many", check=False).stdout, timeout=30)
    out = supervise(daemon_env, "stack", "many", check=False)
    first = out.stdout.splitlines()[0]
    # The wrapper's shell, the job, 70 shells (and their sleeps, as they come): 64 dumped, and said so.
    counted = re.search(r": 64 of (\d+) processes dumped \(at most 64 are\), 1 with a Python stack$", first)
    assert counted is not None and int(counted.group(1)) >= 72, first
    assert out.returncode == 0 and "waiting_for_workers" in out.stdout, out.stdout[-2000:]
    assert secret not in out.stdout and "--hf-token=***" in out.stdout, out.stdout[:3000]
    client.stop("many", grace_s=1.0)


def test_a_py_spy_that_does_not_answer_is_killed_and_reaped_at_its_bound(home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A py-spy stuck on its target (a process in the kernel's uninterruptible sleep): it writes its pid, never answers.
    hung = home / "py-spy"
    hung.write_text(f"#!{sys.executable}\nimport os, sys, time\n"
                    f"open({str(home / 'pyspy.pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)\n")
    hung.chmod(0o755)
    monkeypatch.setenv(stacks.ENV_PYSPY, str(hung))
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            began = time.monotonic()
            dump = asyncio.run(stacks.dump([target.pid], timeout_s=1.0))
            assert time.monotonic() - began < 4
            pid = int((home / "pyspy.pid").read_text())
            wait_until(lambda: not psutil.pid_exists(pid), timeout=5)  # killed, and its exit read
            gc.collect()  # a subprocess transport left open says so when it is collected
    finally:
        target.kill()
        target.wait()
    assert not [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    [only] = dump.processes
    assert (only.pid, only.stack, only.error) == (target.pid, None, "py-spy took more than 1s")
