"""Containment, end to end with a real daemon: a slow probe pack never stalls the daemon, a
fault inside a runner never leaves a live process unsupervised, `stop` reaches every live
attempt, a failed launch ends its attempt, and recovery never overwrites a newer attempt."""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise
from test_full_disk import small_home  # noqa: F401 - the 4 MiB tmpfs fixture

from supervisor.core.actions import AttemptAction
from supervisor.core.config import Paths
from supervisor.core.events import AttemptState, Verdict
from supervisor.spec.model import load_spec
from supervisor.store.attempt_writes import AttemptEnd, ExitCode
from supervisor.store.database import AttemptRow, Store

# Valid RE2 within the load-time bounds (program size 9,906, fanout bucket under 8), yet about
# 80 CPU seconds per MB on 1,000-character lines of words (15 s/MB on 200-character ones).
SLOW_PACK = """\
name = "slowpack"
[[probes]]
id = "words"
kind = "info"
regex = '(?P<x>(\\w+\\s?){0,900})$'
"""

# A progress probe whose `done` is a float: "step inf/10" gives done = inf, which the
# watchdog cannot turn into a step count (OverflowError).
FLOAT_PACK = """\
name = "floaty"
[[probes]]
id = "step"
kind = "progress"
regex = 'step (?P<done>\\S+)/(?P<total>\\d+)'
fields = { done = "float", total = "int" }
"""

WORDS_JOB = """\
import sys, time
line = ("alpha beta gamma delta epsilon zeta eta theta iota kappa " * 20)[:999]
for _ in range(3000):  # about 3 MB
    print(line)
sys.stdout.flush()
time.sleep(1)
print("all good", flush=True)
"""

INF_STEP_JOB = """\
import time
print("step 1/10", flush=True)
print("step inf/10", flush=True)
for i in range(2, 10):
    print(f"step {i}/10", flush=True)
    time.sleep(0.05)
while True:
    time.sleep(1)
"""

SLEEPER_JOB = "import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(1)\n"
QUICK_JOB = "print('all good', flush=True)\n"


def _spec(home: Path, name: str, script: str, *, pack: str | None = None) -> Path:
    jobs = home / "specs"
    jobs.mkdir(exist_ok=True)
    script_path = jobs / f"{name}.py"
    script_path.write_text(script)
    probe_files = ""
    if pack is not None:
        pack_path = jobs / f"{name}-pack.toml"
        pack_path.write_text(pack)
        probe_files = f'probe_files = ["{pack_path}"]\n'
    spec = jobs / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "{name}"
        command = ["{{python}}", "{script_path}"]
        probes = ["python", "tqdm", "transformers"]
        stop_grace_s = 2
        """) + probe_files + f'[restart]\nmax_attempts = 1\n[env]\nSUPERVISE_HOME = "{home}"\n')
    return spec


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def test_a_slow_pack_never_stalls_the_daemon_and_is_disabled(daemon: DaemonProcess, home: Path) -> None:
    client = daemon.client()
    client.start(str(_spec(home, "slow", WORDS_JOB, pack=SLOW_PACK)), {})
    worst = 0.0

    def disabled() -> bool:
        nonlocal worst
        started = time.monotonic()
        client.ping()
        events = client.events("slow").events
        worst = max(worst, time.monotonic() - started)
        return any(e.kind == "alert" and e.data.get("pack") == "slowpack" for e in events)

    wait_until(disabled, timeout=60)
    # Matched on the loop, 3 MB through this pack took minutes with every request unanswered.
    assert worst < 1.0, f"a request took {worst:.2f}s while the slow pack ran"
    alert = next(e for e in client.events("slow").events if e.kind == "alert")
    assert "slowpack" in alert.message and "budget" in alert.data["reason"]
    # Supervision went on: the exit is seen and judged.
    wait_until(lambda: job_state(client, "slow") == "done", timeout=60)
    assert client.attempts("slow").attempts[0].exit_code == 0


def test_a_fault_in_the_watchdog_is_contained_and_stop_still_kills(daemon: DaemonProcess, home: Path,
                                                                   daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    client.start(str(_spec(home, "inf", INF_STEP_JOB, pack=FLOAT_PACK)), {})
    # The log is still followed after the line the watchdog could not take.
    wait_until(lambda: any(e.kind == "progress" and e.data.get("done") == 9 for e in client.events("inf").events))
    contained = [e for e in client.events("inf").events if e.kind == "action" and "OverflowError" in e.message]
    assert len(contained) == 1, [e.message for e in client.events("inf").events]
    pid = client.attempts("inf").attempts[0].pid
    assert pid is not None and not _gone(pid)
    stopped = supervise(daemon_env, "stop", "inf")
    assert "stopped inf" in stopped.stdout, stopped.stdout + stopped.stderr
    wait_until(lambda: _gone(pid), timeout=10)
    assert job_state(client, "inf") == "stopped"
    attempt = client.attempts("inf").attempts[0]
    assert attempt.state == "stopped" and attempt.action == "stopped by user"


def test_stop_reaches_a_live_attempt_no_runner_watches(daemon: DaemonProcess, home: Path,
                                                       daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    spec = _spec(home, "orphan", SLEEPER_JOB, pack=FLOAT_PACK)
    client.start(str(spec), {})
    wait_until(lambda: (a := client.attempts("orphan").attempts) and a[0].pid is not None)
    pid = client.attempts("orphan").attempts[0].pid
    daemon.stop()  # detaches: the job runs on
    (home / "specs" / "orphan-pack.toml").unlink()  # its pack is gone: no runner on restart
    daemon.start()
    client = daemon.client()
    assert job_state(client, "orphan") == "failed" and not _gone(pid)
    stopped = supervise(daemon_env, "stop", "orphan")
    assert stopped.returncode == 0 and "not running" not in stopped.stdout, stopped.stdout
    assert "stopped orphan" in stopped.stdout
    wait_until(lambda: _gone(pid), timeout=10)
    assert job_state(client, "orphan") == "stopped"
    assert client.attempts("orphan").attempts[0].state == "stopped"


def test_a_failed_launch_ends_its_attempt_and_restart_keeps_the_later_result(
        daemon: DaemonProcess, home: Path, daemon_env: dict[str, str]) -> None:
    spec = _spec(home, "badlaunch", QUICK_JOB)
    # A directory where attempt 1's exit-status file goes: the launch fails with an OSError.
    (Paths(home).logs / "badlaunch" / "attempt-1.exit").mkdir(parents=True)
    failed = supervise(daemon_env, "start", str(spec), check=False)
    assert failed.returncode == 69 and "Traceback" not in failed.stderr, failed.stderr
    client = daemon.client()
    wait_until(lambda: job_state(client, "badlaunch") == "failed")
    first = client.attempts("badlaunch").attempts[0]
    assert first.state == "ended" and first.action == "give up: launch failed", first
    supervise(daemon_env, "start", str(spec))
    wait_until(lambda: job_state(client, "badlaunch") == "done")
    daemon.stop()
    daemon.start()
    client = daemon.client()
    assert job_state(client, "badlaunch") == "done"


def test_recovery_never_overwrites_a_newer_attempt(home: Path, daemon_env: dict[str, str], monkeypatch) -> None:
    """An attempt left `launching` (the daemon died as it launched) before a later attempt
    that ended `done`: recovery marks the old one lost and leaves the job `done`."""
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    spec = _spec(home, "older", QUICK_JOB)
    paths = Paths(home)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(paths.db)
    loaded = load_spec(spec)
    store.upsert_job("older", loaded.model_dump(mode="json"), "done", "exited 0")

    def row(n: int, state: str, pid: int | None) -> AttemptRow:
        return AttemptRow(job="older", n=n, tag=f"older.{n}.x", host="local", argv=["true"], workdir=str(home),
                          log_path=str(home / f"a{n}.log"), status_path=str(home / f"a{n}.exit"), pid=pid, pgid=pid,
                          start_time=None, started=time.time(), ended=None, state=state, exit_code=None,
                          exit_signal=None, log_offset=0, phase=None, progress=None, verdict=None, reason=None,
                          failure=None, fingerprint=None, action=None)

    store.add_attempt(row(1, "launching", None))
    store.add_attempt(row(2, "running", None))
    store.end_attempt(AttemptEnd(state=AttemptState.ENDED, exit=ExitCode(0, None), verdict=Verdict.DONE,
                                 action=AttemptAction.none("job done"), reason="exited 0"), [], job="older", n=2)
    store.close()
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        assert job_state(client, "older") == "done"
        attempts = client.attempts("older").attempts
        assert attempts[0].state == "lost" and attempts[1].verdict == "done"
    finally:
        daemon.close()


def test_stop_of_a_watched_job_goes_through_its_runner(daemon: DaemonProcess, home: Path) -> None:
    client = daemon.client()
    client.start(str(_spec(home, "plain", SLEEPER_JOB)), {})
    wait_until(lambda: any(e.kind == "launched" for e in client.events("plain").events))
    pid = client.attempts("plain").attempts[0].pid
    response = client.stop("plain", grace_s=1.0)
    assert pid in {p.pid for p in response.processes}
    assert job_state(client, "plain") == "stopped"
    wait_until(lambda: _gone(pid), timeout=10)
    assert client.attempts("plain").attempts[0].exit_signal == signal.SIGTERM


def test_a_job_that_exits_on_a_full_disk_is_recorded_once_there_is_room(
        small_home: Path,  # noqa: F811 - the fixture imported above
        daemon_env: dict[str, str], monkeypatch) -> None:
    """The store is full when the job exits 0: its exit, verdict and end are kept and stored
    once space returns (before, supervision ended for good and the job read `failed`)."""
    env = {**daemon_env, "SUPERVISE_HOME": str(small_home)}
    monkeypatch.setenv("SUPERVISE_HOME", str(small_home))
    # The job waits while the gate exists: removing it needs no room on the full disk.
    gate = small_home / "gate"
    gate.touch()
    script = (
        "import os, time\n"
        "for i in range(1, 21):\n"
        "    print(f'Loading checkpoint shards: {i*5}%|#| {i}/40 [00:00<00:01, 5.0it/s]', flush=True)\n"
        f"while os.path.exists('{gate}'):\n"
        "    time.sleep(0.01)\n")  # then exits 0 without writing: the disk is full
    spec = _spec(small_home, "fullexit", script)
    # The daemon's own log lives off the small disk: it must say when it meets the full store.
    outside = Path(tempfile.mkdtemp(prefix="sv-log-", dir="/tmp")) / "daemon-test.log"
    (small_home / "daemon-test.log").symlink_to(outside)
    # Made before anything runs, while there is room: the store's WAL may fill the small disk by
    # itself before the test fills it.  The ballast is freed with the filler when room returns;
    # the spares are freed one at a time, room for the exit status, not for the store (a store
    # write retried at that moment may take a freed page first; then the next one is freed).
    ballast = small_home / "ballast"
    ballast.write_bytes(b"\0" * (1 << 20))
    spares = [small_home / f"spare{i}" for i in range(8)]
    for spare in spares:
        spare.write_bytes(b"\0" * 4096)
    filler = small_home / "filler"
    filler.touch()
    daemon = DaemonProcess(small_home, env)
    daemon.start()
    try:
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: len([e for e in client.events("fullexit").events if e.kind == "progress"]) >= 20)
        pid = client.attempts("fullexit").attempts[0].pid
        with open(filler, "ab", buffering=0) as f:  # fill the disk to the last byte: unbuffered, so close has nothing left to write
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        gate.unlink()
        # The command has exited; its wrapper waits for room to write the exit status.
        # (Its only child is then the retry loop's `sleep 1`.)
        wait_until(lambda: all(c.name() == "sleep" for c in psutil.Process(pid).children()), timeout=30)
        # The status is written, the wrapper ends: the daemon sees the exit, the store is full.
        for spare in spares:
            spare.unlink()
            if _wait_gone(pid, 3.0):
                break
        assert _gone(pid), "the wrapper never wrote the exit status"
        # The runner met the full store (it says so in its log), then room returns.
        wait_until(lambda: re.search(r"cannot store|store cannot be written", daemon.log_text()))
        assert client.ping().pid == daemon.proc.pid
        filler.unlink()
        ballast.unlink()
        wait_until(lambda: job_state(client, "fullexit") != "running", timeout=30)
        assert job_state(client, "fullexit") == "done", client.status("fullexit").jobs[0].reason
        attempt = client.attempts("fullexit").attempts[0]
        assert (attempt.state, attempt.exit_code, attempt.verdict) == ("ended", 0, "done"), attempt
        kinds = [e.kind for e in client.events("fullexit").events]
        assert kinds.count("exited") == 1 and kinds.count("verdict") == 1 and kinds.count("progress") == 20
    finally:
        daemon.close()
        shutil.rmtree(outside.parent, ignore_errors=True)
