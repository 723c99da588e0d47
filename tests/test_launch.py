"""The local host: detached launch, exit noticed without polling, whole-tree kill."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from e2e_jobs import STOPPED_JOB

from supervisor.core.errors import LaunchError
from supervisor.hosts.base import LaunchRequest, ProcessHandle
from supervisor.hosts.local.host import LocalHost


def request(tmp_path: Path, code: str, tag: str = "t.1.abc", workdir: Path | None = None) -> LaunchRequest:
    return LaunchRequest(argv=[sys.executable, "-c", code], workdir=str(workdir or tmp_path), env={"PYTHONUNBUFFERED": "1"},
                         log_path=str(tmp_path / "logs" / "attempt-1.log"),
                         status_path=str(tmp_path / "logs" / "attempt-1.exit"), tag=tag)


def test_launch_is_detached_tagged_and_exit_is_recorded(tmp_path: Path) -> None:
    code = "import os,sys; print(os.getsid(0)==os.getpid(), os.environ['SUPERVISE_ATTEMPT'], sys.stdin.read()=='' ); sys.exit(7)"
    # An hour-long poll interval proves the exit is noticed by the pidfd, not by polling.
    host = LocalHost(tmp_path, poll_interval_s=3600)

    async def run() -> tuple[ProcessHandle, float, object]:
        handle = await host.launch(request(tmp_path, code))
        start = time.monotonic()
        status = await asyncio.wait_for(host.wait_exit(handle), timeout=10)
        return handle, time.monotonic() - start, status

    handle, waited, status = asyncio.run(run())
    assert status.returncode == 7 and status.signal is None
    log = Path(handle.log_path).read_text()
    # The wrapper is the session leader; the command is its child in the same session.
    assert "t.1.abc True" in log
    assert waited < 5
    assert handle.pgid == handle.pid


def test_signal_death_is_reported(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)

    async def run() -> object:
        handle = await host.launch(request(tmp_path, "import os,signal; os.kill(os.getpid(), signal.SIGSEGV)"))
        return await host.wait_exit(handle)

    status = asyncio.run(run())
    assert status.signal == signal.SIGSEGV


def test_liveness_checks_start_time_against_pid_reuse(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)

    async def run() -> tuple[bool, bool]:
        handle = await host.launch(request(tmp_path, "import time; time.sleep(30)"))
        alive = await host.is_alive(handle)
        impostor = ProcessHandle(pid=handle.pid, start_time=(handle.start_time or 0) - 100, pgid=handle.pgid,
                                 tag=handle.tag, log_path=handle.log_path, status_path=handle.status_path)
        fooled = await host.is_alive(impostor)
        await host.kill_tree(handle, 1.0)
        return alive, fooled

    alive, fooled = asyncio.run(run())
    assert alive and not fooled


def test_kill_tree_finds_escaped_tagged_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "escaped.pid"
    code = f"""
import os, time, signal
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stubborn: needs SIGKILL
        open("{pid_file}", "w").write(str(os.getpid()))
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""
    host = LocalHost(tmp_path)

    async def run() -> tuple[int, object, set[int]]:
        handle = await host.launch(request(tmp_path, code))
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        escaped = int(pid_file.read_text())
        pids = await host.attempt_pids(handle)
        report = await host.kill_tree(handle, 0.5)
        return escaped, report, pids

    escaped, report, pids = asyncio.run(run())
    assert escaped in pids
    assert escaped in {pid for pid, _ in report.killed}
    assert report.reparented == [escaped]  # its parent had exited: found by tag, not in the tree
    assert "(1 of them re-parented, found by tag)" in report.summary()
    assert not report.survivors
    assert not psutil.pid_exists(escaped) or psutil.Process(escaped).status() == psutil.STATUS_ZOMBIE


def test_a_stopped_process_is_continued_so_that_sigterm_reaches_it(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)

    async def run() -> tuple[object, float, object]:
        handle = await host.launch(request(tmp_path, STOPPED_JOB))
        deadline = time.monotonic() + 10
        while not any(c.status() == psutil.STATUS_STOPPED for c in psutil.Process(handle.pid).children()):
            assert time.monotonic() < deadline, "the job never stopped itself"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        report = await host.kill_tree(handle, 10.0)
        took = time.monotonic() - started
        return report, took, await asyncio.wait_for(host.wait_exit(handle), 5)

    report, took, status = asyncio.run(run())
    assert not report.killed and not report.survivors  # SIGTERM sufficed: no SIGKILL after the grace
    assert took < 5
    assert "clean shutdown" in (tmp_path / "logs" / "attempt-1.log").read_text()
    assert status.returncode == 0  # the spared wrapper recorded the job's own exit


def test_bad_workdir_is_a_launch_error_with_the_reason(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)

    async def run() -> object:
        handle = await host.launch(request(tmp_path, "print(1)", workdir=tmp_path / "missing"))
        return await host.wait_exit(handle)

    try:
        status = asyncio.run(run())
    except LaunchError as exc:
        assert "missing" in str(exc)
    else:
        # The wrapper may start before failing: then the failure is in the log and the status.
        assert status.returncode != 0
        assert "cannot enter working directory" in (tmp_path / "logs" / "attempt-1.log").read_text()


def test_sighup_does_not_reach_the_job(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)

    async def run() -> object:
        handle = await host.launch(request(tmp_path, "import time; time.sleep(0.5); print('survived')"))
        os.killpg(handle.pgid, signal.SIGHUP)
        return await host.wait_exit(handle)

    status = asyncio.run(run())
    assert status.returncode == 0
    assert "survived" in (tmp_path / "logs" / "attempt-1.log").read_text()


@pytest.mark.parametrize("code", ["", "x"])
def test_exit_status_parse(tmp_path: Path, code: str) -> None:
    host = LocalHost(tmp_path)
    status_path = tmp_path / "s.exit"
    status_path.write_text(code)
    handle = ProcessHandle(pid=1, start_time=None, pgid=1, tag="x", log_path="", status_path=str(status_path))
    assert asyncio.run(host.exit_status(handle)) is None


def test_a_bare_or_init_pid_never_anchors_a_kill(tmp_path: Path) -> None:
    """A handle naming pid 1 (or any pid without a start time) finds only tagged processes."""
    import subprocess

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host = LocalHost(tmp_path)
        for pid in (1, bystander.pid):
            handle = ProcessHandle(pid=pid, start_time=None, pgid=pid, tag="no-such-tag", log_path="",
                                   status_path=str(tmp_path / "none.exit"))
            assert asyncio.run(host.attempt_pids(handle)) == set()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_kill_report_counts_each_process_once() -> None:
    from supervisor.hosts.base import KillReport

    # 7 processes: 4 ended on TERM, 3 needed KILL (one of them also listed as TERMed), 2 re-parented.
    report = KillReport(terminated=[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")],
                        killed=[(5, "e"), (6, "f"), (7, "g")], reparented=[6, 7])
    said = report.summary()
    assert said == "7 processes: 4 ended on SIGTERM, 3 needed SIGKILL (2 of them re-parented, found by tag)", said
