"""The SSH host against a real OpenSSH server on loopback: launch, exit, liveness, kill,
follow (records identical to the local follower's), dropped connections, host keys and
logins, nvidia-smi sampling, doctor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil
import pytest
import structlog.testing
from e2e_jobs import STOPPED_JOB

from supervisor.core.errors import ConnectionLost, HostError, LaunchError
from supervisor.core.events import Record
from supervisor.gpu.nvml import new_faults
from supervisor.hosts.base import LaunchRequest, ProcessHandle
from supervisor.hosts.local.follow import LogFollower
from supervisor.hosts.ssh.host import SshHost, parse_target

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]  # the session-scoped sshd_server fixture

T = TypeVar("T")


@pytest.fixture
def ssh_env(sshd_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Client settings for the test server; HOME points elsewhere so ~/.ssh is never read."""
    fake_home = tmp_path / "home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    env = sshd_server.env()
    env["SUPERVISE_SSH_LOG_ROOT"] = str(tmp_path / "remote-logs")
    env["SUPERVISE_SSH_RETRY_S"] = "20"
    return env


@pytest.fixture
def url(sshd_server: SshServer) -> str:
    return sshd_server.url


@pytest.fixture
def cleanup_tags() -> Iterator[list[str]]:
    """Tags of attempts a test started: anything still carrying one is killed afterwards."""
    tags: list[str] = []
    yield tags
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("SUPERVISE_ATTEMPT") in tags:
                proc.kill()


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


def request(tmp_path: Path, code: str, tag: str, *, workdir: Path | None = None, n: int = 1,
            env: dict[str, str] | None = None, argv: list[str] | None = None) -> LaunchRequest:
    logs = tmp_path / "remote-logs" / "job"
    return LaunchRequest(argv=argv or [sys.executable, "-c", code], workdir=str(workdir or tmp_path),
                         env={"PYTHONUNBUFFERED": "1", **(env or {})},
                         log_path=str(logs / f"attempt-{n}.log"), status_path=str(logs / f"attempt-{n}.exit"), tag=tag)


def wait_for_file(path: Path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


# -- launch, exit, liveness ------------------------------------------------------------------

def test_launch_is_detached_tagged_and_exit_is_noticed_at_once(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.1.abc")
    code = ("import os,sys,time; time.sleep(0.3); "
            "print(os.getpgid(0)==os.getppid(), os.environ['SUPERVISE_ATTEMPT'], sys.stdin.read()==''); sys.exit(7)")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[ProcessHandle, float, Any, tuple[str, str]]:
        try:
            paths = await host.log_paths("job", 1)
            handle = await host.launch(request(tmp_path, code, "s.1.abc"))
            start = time.monotonic()
            status = await asyncio.wait_for(host.wait_exit(handle), timeout=10)
            return handle, time.monotonic() - start, status, paths
        finally:
            await host.close()

    handle, waited, status, paths = run(go)
    assert paths == (str(tmp_path / "remote-logs/job/attempt-1.log"), str(tmp_path / "remote-logs/job/attempt-1.exit"))
    assert status.returncode == 7 and status.signal is None
    # The wrapper leads its own session and group; the command runs in that group.
    assert "True s.1.abc True" in Path(handle.log_path).read_text()
    assert handle.pgid == handle.pid
    assert handle.start_time is not None
    assert waited < 3.0  # 0.3 s of work, then a 0.1 s remote poll: no client-side polling loop


def test_signal_death_and_start_time_against_pid_reuse(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.2.abc")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[bool, bool, Any, bool, Any]:
        try:
            go_file = tmp_path / "go"
            code = (f"import os,signal,time\nwhile not os.path.exists({str(go_file)!r}): time.sleep(0.01)\n"
                    "os.kill(os.getpid(), signal.SIGSEGV)")
            handle = await host.launch(request(tmp_path, code, "s.2.abc"))
            alive = await host.is_alive(handle)
            impostor = ProcessHandle(pid=handle.pid, start_time=(handle.start_time or 0) - 100, pgid=handle.pgid,
                                     tag=handle.tag, log_path=handle.log_path, status_path=handle.status_path)
            fooled = await host.is_alive(impostor)
            before = await host.exit_status(handle)
            go_file.write_text("")
            status = await host.wait_exit(handle)
            return alive, fooled, status, await host.is_alive(handle), before
        finally:
            await host.close()

    alive, fooled, status, after, before = run(go)
    assert alive and not fooled and not after
    assert before is None
    assert status.signal == signal.SIGSEGV


def test_exit_status_read_later_carries_when_the_command_ended(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    # Read 3 s after the end (as a re-adopting daemon does): its time is the status file's, by the
    # box's clock, not the time of the read.
    cleanup_tags.append("s.3.abc")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[Any, float, float]:
        try:
            handle = await host.launch(request(tmp_path, "import sys; sys.exit(3)", "s.3.abc"))
            await asyncio.wait_for(host.wait_exit(handle), timeout=10)
            written = Path(handle.status_path).stat().st_mtime
            await asyncio.sleep(3.0)
            read_at = time.time()
            return await host.exit_status(handle), written, read_at
        finally:
            await host.close()

    status, written, read_at = run(go)
    assert status is not None and status.returncode == 3
    assert status.ended_at is not None and abs(status.ended_at - written) < 1.5, (status.ended_at, written, read_at)


def test_a_logs_size_and_last_change_are_read_on_the_box(ssh_env, tmp_path: Path, url: str) -> None:
    # What a re-adopted remote attempt must read, and how to date it: the log's size, and its last
    # change by its age on the box's clock (here the same machine's: it must match the file's mtime).
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"x" * 12_345)
    changed = time.time() - 7.5
    os.utime(log, (changed, changed))
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[Any, Any]:
        try:
            return await host.log_stat(str(log)), await host.log_stat(str(tmp_path / "absent.log"))
        finally:
            await host.close()

    found, absent = run(go)
    assert found is not None and found.size == 12_345 and abs(found.modified_at - changed) < 0.5, (found, changed)
    assert absent is None


def test_a_box_that_goes_away_ends_the_exit_watch_and_the_follow_with_connection_lost(
        ssh_env, tmp_path: Path, cleanup_tags, url: str, sshd_server: SshServer) -> None:
    # The box stops answering (connections cut, new ones refused): what waits on it is told within
    # a few seconds, so that its attempt reads `unreachable` and is not judged meanwhile.
    cleanup_tags.append("s.away.abc")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[BaseException | None, BaseException | None, float]:
        try:
            handle = await host.launch(request(tmp_path, "import time\nwhile True: time.sleep(0.1)", "s.away.abc"))
            follower = host.follow(handle.log_path, 0)

            async def follow() -> None:
                async for _ in follower.records():
                    pass

            exit_wait = asyncio.ensure_future(host.wait_exit(handle))
            following = asyncio.ensure_future(follow())
            await asyncio.sleep(0.5)
            sshd_server.go_away()
            away = time.monotonic()
            try:
                done, _ = await asyncio.wait({exit_wait, following}, timeout=30, return_when=asyncio.ALL_COMPLETED)
                told_in = time.monotonic() - away
            finally:
                sshd_server.come_back()
            errors = [t.exception() if t in done else None for t in (exit_wait, following)]
            for task in (exit_wait, following):
                task.cancel()
            await follower.aclose()
            await host.kill_tree(handle, 0.5)
            return errors[0], errors[1], told_in
        finally:
            await host.close()

    exit_error, follow_error, told_in = run(go)
    assert isinstance(exit_error, ConnectionLost) and isinstance(follow_error, ConnectionLost), (exit_error, follow_error)
    assert told_in < 15, told_in


def test_short_operations_share_one_resident_shell_that_is_replaced_if_it_dies(ssh_env, url: str) -> None:
    host = SshHost(url, env=ssh_env)

    def shells() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["/bin/sh", "-s"]
                and "SUPERVISE_ATTEMPT" not in _environ(p)]

    earlier = {p.pid for p in shells()}

    def resident_shells() -> list[psutil.Process]:  # this test's own
        return [p for p in shells() if p.pid not in earlier]

    async def go() -> tuple[int, float, str, int]:
        try:
            await host.remote_home()
            before = resident_shells()
            started = time.monotonic()
            for _ in range(20):
                assert await host.exit_status(ProcessHandle(0, None, 0, "x", "", "/nonexistent")) is None
            per_op = (time.monotonic() - started) / 20
            for proc in before:
                proc.kill()
            host._home = None  # ask again: the next operation finds its shell gone
            home = await host.remote_home()
            return len(before), per_op, home, host.connects
        finally:
            await host.close()

    shells, per_op, home, connects = run(go)
    assert shells == 1  # one resident shell served every short operation
    assert per_op < 0.05  # no login shell (and its rc files) per operation
    assert home and connects == 1  # replaced without reconnecting


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def test_log_paths_never_pick_an_existing_log_and_tilde_is_the_remote_home(ssh_env, tmp_path: Path, url: str) -> None:
    existing = tmp_path / "remote-logs" / "job" / "attempt-3.log"
    existing.parent.mkdir(parents=True)
    existing.write_text("old")
    (existing.parent / "attempt-3.1.log").write_text("older")
    host = SshHost(url, env=ssh_env)
    default = SshHost(url, env={k: v for k, v in ssh_env.items() if k != "SUPERVISE_SSH_LOG_ROOT"})

    async def go() -> tuple[tuple[str, str], str]:
        try:
            return await host.log_paths("job", 3), await default.log_root()
        finally:
            await host.close()
            await default.close()

    paths, root = run(go)
    assert paths[0].endswith("job/attempt-3.2.log") and paths[1].endswith("job/attempt-3.2.exit")
    remote_home = os.path.expanduser(f"~{psutil.Process().username()}")
    assert root == f"{remote_home}/.local/state/supervise/logs"


def test_bad_workdir_is_a_launch_error_with_the_reason(ssh_env, tmp_path: Path, url: str) -> None:
    host = SshHost(url, env=ssh_env)

    async def go() -> object:
        try:
            return await host.launch(request(tmp_path, "print(1)", "s.3.abc", workdir=tmp_path / "missing"))
        finally:
            await host.close()

    with pytest.raises(LaunchError, match="missing"):
        run(go)


def test_argv_and_env_values_are_never_shell_code(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.4.abc")
    marker = tmp_path / "pwned"
    evil = [f"; touch {marker}; #", f"$(touch {marker})", f"`touch {marker}`", "it's \"quoted\"\n2nd line", "*"]
    code = "import json,os,sys; print(json.dumps([sys.argv[1:], os.environ['EVIL']]))"
    host = SshHost(url, env=ssh_env)

    async def go() -> Any:
        try:
            req = request(tmp_path, code, "s.4.abc", env={"EVIL": f"$(touch {marker})'\""},
                          argv=[sys.executable, "-c", code, *evil])
            handle = await host.launch(req)
            return handle, await host.wait_exit(handle)
        finally:
            await host.close()

    handle, status = run(go)
    import json

    assert status.returncode == 0
    assert json.loads(Path(handle.log_path).read_text()) == [evil, f"$(touch {marker})'\""]
    assert not marker.exists()


def test_repeated_launch_adopts_the_first_instead_of_starting_twice(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    # What a launch retried after a dropped connection does: the log exists, so the attempt
    # already started; it is found by its tag.
    cleanup_tags.append("s.5.abc")
    host = SshHost(url, env=ssh_env)
    req = request(tmp_path, "import time; print('once', flush=True); time.sleep(30)", "s.5.abc")

    async def go() -> tuple[ProcessHandle, ProcessHandle, set[int]]:
        try:
            first = await host.launch(req)
            second = await host.launch(req)
            pids = await host.attempt_pids(first)
            await host.kill_tree(first, 0.5)
            return first, second, pids
        finally:
            await host.close()

    first, second, pids = run(go)
    assert (second.pid, second.start_time) == (first.pid, first.start_time)
    assert Path(req.log_path).read_text().count("once") == 1
    assert len(pids) == 2  # the wrapper and its python: nothing launched twice


# -- kill ----------------------------------------------------------------------------------------

ESCAPER = """
import os, time, signal
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()  # escape the attempt's process group and session
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stubborn: needs SIGKILL
        open("{pid_file}.tmp", "w").write(str(os.getpid()))
        os.rename("{pid_file}.tmp", "{pid_file}")
        time.sleep(60)
    os._exit(0)  # the middle process exits: the grandchild is re-parented
print("parent waiting", flush=True)
time.sleep(60)
"""


def test_kill_tree_finds_the_escaped_tagged_grandchild(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.6.abc")
    pid_file = tmp_path / "escaped.pid"
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[int, ProcessHandle, set[int], Any, set[int], Any]:
        try:
            handle = await host.launch(request(tmp_path, ESCAPER.format(pid_file=pid_file), "s.6.abc"))
            escaped = int(await asyncio.to_thread(wait_for_file, pid_file))
            pids = await host.attempt_pids(handle)
            started = time.monotonic()
            report = await host.kill_tree(handle, 0.5)
            took = time.monotonic() - started
            status = await asyncio.wait_for(host.wait_exit(handle), 10)
            return escaped, handle, pids, report, await host.attempt_pids(handle), (took, status)
        finally:
            await host.close()

    escaped, handle, pids, report, after, (took, status) = run(go)
    assert os.getpgid(escaped) != handle.pgid  # it really escaped
    assert {handle.pid, escaped} <= pids
    assert escaped in {pid for pid, _ in report.killed}
    assert report.reparented == [escaped]  # its parent had exited: found by tag, not in the tree
    # The wrapper is spared SIGTERM: it ends once its command has, after recording its status.
    assert handle.pid in {pid for pid, _ in report.terminated}
    names = dict(report.terminated + report.killed)
    assert "python" in names[escaped] and "-c" in names[escaped]
    assert not report.survivors and not after
    assert not psutil.pid_exists(escaped) or psutil.Process(escaped).status() == psutil.STATUS_ZOMBIE
    assert took < 5
    assert status.signal == signal.SIGTERM


def test_a_stopped_remote_process_is_continued_so_that_sigterm_reaches_it(
    ssh_env, tmp_path: Path, cleanup_tags, url: str
) -> None:
    cleanup_tags.append("s.7.abc")
    host = SshHost(url, env=ssh_env)
    log = tmp_path / "remote-logs" / "job" / "attempt-1.log"

    def stopped() -> bool:
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SUPERVISE_ATTEMPT") == "s.7.abc" and proc.status() == psutil.STATUS_STOPPED:
                    return True
        return False

    async def go() -> tuple[Any, float, Any]:
        try:
            handle = await host.launch(request(tmp_path, STOPPED_JOB, "s.7.abc"))
            deadline = time.monotonic() + 10
            while not stopped():
                assert time.monotonic() < deadline, "the job never stopped itself"
                await asyncio.sleep(0.02)
            started = time.monotonic()
            report = await host.kill_tree(handle, 10.0)
            took = time.monotonic() - started
            return report, took, await asyncio.wait_for(host.wait_exit(handle), 10)
        finally:
            await host.close()

    report, took, status = run(go)
    assert not report.killed and not report.survivors
    assert took < 5
    assert "clean shutdown" in log.read_text()
    assert status.returncode == 0


def test_an_unidentified_pid_never_lends_its_tree_or_group(ssh_env, tmp_path: Path, url: str) -> None:
    # A handle whose start time is unknown may name a reused pid: only tagged processes may
    # then be touched, never the group or children of whatever now holds that pid.
    bystander = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)
    host = SshHost(url, env=ssh_env)

    def handle(pid: int) -> ProcessHandle:
        return ProcessHandle(pid=pid, start_time=None, pgid=pid, tag="nobody.0.x", log_path="", status_path="/nonexistent")

    async def go() -> tuple[set[int], set[int], Any]:
        try:
            return (await host.attempt_pids(handle(1)), await host.attempt_pids(handle(bystander.pid)),
                    await host.kill_tree(handle(bystander.pid), 0.2))
        finally:
            await host.close()

    try:
        deadline = time.monotonic() + 5
        while not psutil.Process(bystander.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        children = {p.pid for p in psutil.Process(bystander.pid).children()}
        of_init, of_bystander, report = run(go)
        assert of_init == set() and of_bystander == set()
        assert not report.terminated and not report.killed and not report.survivors
        assert bystander.poll() is None and {p.pid for p in psutil.Process(bystander.pid).children()} == children
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)
        bystander.wait()


# -- the connection dies; the job does not ---------------------------------------------------------

def test_job_survives_dropped_connections_and_every_operation_reconnects(
        ssh_env, sshd_server: SshServer, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.7.abc")
    go_file = tmp_path / "go"
    code = ("import os,sys,time\nfor i in range(1, 61):\n    print(f'step {i}/60', flush=True)\n    time.sleep(0.02)\n"
            f"    while i == 59 and not os.path.exists({str(go_file)!r}): time.sleep(0.01)\nsys.exit(3)\n")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[Any, list[Record], int, int]:
        try:
            handle = await host.launch(request(tmp_path, code, "s.7.abc"))
            follower = host.follow(handle.log_path, 0)
            records: list[Record] = []

            async def read() -> None:
                async for batch in follower.records():
                    records.extend(batch)

            reader = asyncio.create_task(read())
            exit_wait = asyncio.create_task(host.wait_exit(handle))
            # The follow is under way before the first drop (on a loaded machine it may still be connecting).
            for _ in range(500):
                if records:
                    break
                await asyncio.sleep(0.02)
            drops = 0
            for _ in range(3):
                await asyncio.sleep(0.3)
                drops += await asyncio.to_thread(sshd_server.drop_connections)
                assert await host.is_alive(handle)
            go_file.write_text("")
            status = await asyncio.wait_for(exit_wait, 20)
            follower.finish()
            await asyncio.wait_for(reader, 20)
            await follower.aclose()
            return status, records, drops, follower.restarts
        finally:
            await host.close()

    status, records, drops, restarts = run(go)
    assert drops >= 3 and restarts >= 1
    assert status.returncode == 3  # the job ran to its own end
    assert [r.text for r in records] == [f"step {i}/60" for i in range(1, 61)]
    assert host.connects >= 4


def test_sighup_does_not_reach_the_job(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.8.abc")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[ProcessHandle, Any]:
        try:
            handle = await host.launch(request(tmp_path, "import time; time.sleep(0.5); print('survived')", "s.8.abc"))
            os.killpg(handle.pgid, signal.SIGHUP)
            return handle, await host.wait_exit(handle)
        finally:
            await host.close()

    handle, status = run(go)
    assert status.returncode == 0
    assert "survived" in Path(handle.log_path).read_text()


# -- following ---------------------------------------------------------------------------------------

CONTENT = (b"plain line\n"
           b"crlf line\r\n"
           b"Loading:  10%|#  | 1/10\rLoading:  20%|## | 2/10\rLoading: 100%|###| 10/10\n"
           b"\xff\xfe bad utf-8 \x00 nul\n"
           b"caf\xc3\xa9 \xe2\x9c\x93\n"
           + b"x" * ((1 << 20) + 4321) + b"\n"  # over-long: cut by the splitter
           b"trailing partial line without newline")


async def _records(follower: Any, *, finish_after: float = 0.0) -> list[Record]:
    out: list[Record] = []

    async def read() -> None:
        async for batch in follower.records():
            out.extend(batch)

    task = asyncio.create_task(read())
    await asyncio.sleep(finish_after)
    follower.finish()
    await asyncio.wait_for(task, 30)
    await follower.aclose()
    return out


@pytest.mark.parametrize("offset", [0, 11, 24])
def test_follow_yields_the_same_records_as_the_local_follower(ssh_env, tmp_path: Path, offset: int, url: str) -> None:
    path = tmp_path / "log.txt"
    path.write_bytes(CONTENT)
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[list[Record], list[Record], list[Record], int, int]:
        try:
            local = LogFollower(path, offset)
            remote_streamed = host.follow(str(path), offset)  # followed, then finish
            remote_drained = host.follow(str(path), offset)  # finish at once: one plain read
            streamed = await _records(remote_streamed, finish_after=0.5)
            drained = await _records(remote_drained)
            return await _records(local, finish_after=0.1), streamed, drained, remote_streamed.offset, local.offset
        finally:
            await host.close()

    local, streamed, drained, remote_offset, local_offset = run(go)
    assert local[-1].text == "trailing partial line without newline"
    assert any(r.cut for r in local) and any(r.redraw for r in local)
    assert streamed == local
    assert drained == local
    assert remote_offset == local_offset == len(CONTENT)


def test_follow_a_growing_log_across_dropped_connections(ssh_env, sshd_server: SshServer, tmp_path: Path, url: str) -> None:
    path = tmp_path / "growing.log"
    path.write_bytes(b"")
    host = SshHost(url, env=ssh_env)
    dropped = asyncio.Event()

    async def write() -> None:
        # 200 lines at least, and on until the drops are over: every drop lands while the log grows.
        with open(path, "ab", buffering=0) as handle:
            i = 0
            while i < 200 or not dropped.is_set():
                data = (f"line {i:04d} " + "y" * (i % 7) + ("\r" if i % 5 == 0 else "\n")).encode()
                if i % 3 == 0:  # a line split across writes
                    handle.write(data[:4])
                    await asyncio.sleep(0.002)
                    data = data[4:]
                handle.write(data)
                await asyncio.sleep(0.005)
                i += 1
            handle.write(b"the end, no newline")

    async def go() -> tuple[list[Record], int, list[int]]:
        try:
            follower = host.follow(str(path), 0)
            out: list[Record] = []
            offsets: list[int] = []

            async def read() -> None:
                async for batch in follower.records():
                    out.extend(batch)
                    offsets.append(follower.offset)

            reader = asyncio.create_task(read())
            writer = asyncio.create_task(write())
            for _ in range(4):
                # Drop only once following has (re)started, so that each drop lands on a live follow.
                seen, deadline = len(offsets), time.monotonic() + 20
                while len(offsets) == seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                await asyncio.to_thread(sshd_server.drop_connections)
            dropped.set()
            await writer
            await asyncio.sleep(0.2)
            follower.finish()
            await asyncio.wait_for(reader, 30)
            await follower.aclose()
            return out, follower.restarts, offsets
        finally:
            await host.close()

    remote, restarts, offsets = run(go)

    async def local_records() -> list[Record]:
        return await _records(LogFollower(path, 0))

    assert restarts >= 3  # each drop after the first record lands on a live follow (one may race a reconnect)
    assert remote == run(local_records)  # no gap, no doubled record
    assert offsets == sorted(offsets)


def test_follow_resumes_at_a_stored_offset_and_treats_one_past_the_end_as_a_new_file(ssh_env, tmp_path: Path, url: str) -> None:
    path = tmp_path / "short.log"
    path.write_bytes(b"new file\n")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[list[Record], int]:
        try:
            follower = host.follow(str(path), 5000)
            records = await _records(follower, finish_after=0.3)
            return records, follower.truncations
        finally:
            await host.close()

    records, truncations = run(go)
    assert [(r.text, r.offset, r.generation) for r in records] == [("new file", 0, 1)]  # another file: a new generation
    assert truncations == 1


def test_follow_a_file_that_never_appears_ends_on_finish(ssh_env, tmp_path: Path, url: str) -> None:
    host = SshHost(url, env=ssh_env)

    async def go() -> list[Record]:
        try:
            return await _records(host.follow(str(tmp_path / "nope" / "never.log"), 0), finish_after=0.3)
        finally:
            await host.close()

    assert run(go) == []


def test_closing_a_follower_ends_its_follow_in_the_agent(ssh_env, tmp_path: Path, url: str) -> None:
    path = tmp_path / "closed.log"
    path.write_text("a\n")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[int, int]:
        try:
            follower = host.follow(str(path), 0)
            it = follower.records().__aiter__()
            await asyncio.wait_for(it.__anext__(), 10)
            running = (await host.mux.stats()).follows
            await follower.aclose()
            return running, (await host.mux.stats()).follows
        finally:
            await host.close()

    assert run(go) == (1, 0)


def test_a_full_session_budget_waits_for_a_free_session_then_names_max_sessions(ssh_env, tmp_path: Path) -> None:
    from sshd import SshServer  # the plugin module, imported (and assertion-rewritten) by now

    path = tmp_path / "a.log"
    path.write_text("a\n")
    with SshServer(tmp_path / "sshd2", max_sessions=2) as server:
        host = SshHost(server.url, env={**ssh_env, **server.env(), "SUPERVISE_SSH_RETRY_S": "1"})

        async def go() -> str:
            try:
                follower = host.follow(str(path), 0)  # the agent's session
                await asyncio.wait_for(follower.records().__aiter__().__anext__(), 10)
                other = await host.stream("cat >/dev/null")  # a second long-lived one: the budget is spent
                with pytest.raises(HostError, match="MaxSessions"):
                    await host.remote_home()
                waiting = asyncio.create_task(host.remote_home())
                await asyncio.sleep(0.3)
                other.stdin.write_eof()  # frees one: the waiting operation takes it
                other.close()
                home = await asyncio.wait_for(waiting, 10)
                await follower.aclose()
                return home
            finally:
                await host.close()

        assert run(go) == os.path.expanduser(f"~{psutil.Process().username()}")


# -- a box where the agent cannot run -----------------------------------------------------------

FIX = "install Python 3.8 or newer there, or set SUPERVISE_SSH_PYTHON to one"


@pytest.fixture
def bare_box(tmp_path: Path) -> Iterator[SshServer]:
    """A box whose PATH has no python3 (everything else is there)."""
    from sshd import SshServer, without_python3

    with SshServer(tmp_path / "bare-sshd", extra_config=without_python3(tmp_path / "bare-box")) as server:
        yield server


def test_a_box_without_python3_runs_no_job_and_says_what_to_do_in_one_line(ssh_env, bare_box: SshServer,
                                                                           tmp_path: Path, cleanup_tags) -> None:
    log = tmp_path / "there.log"
    log.write_text("a line\n")
    marker = tmp_path / "ran"
    host = SshHost(bare_box.url, env={**ssh_env, **bare_box.env()})
    someone = ProcessHandle(pid=os.getpid(), start_time=None, pgid=os.getpid(), tag="t", log_path=str(log),
                            status_path=str(tmp_path / "none.exit"))

    async def go() -> tuple[list[str], str]:
        said: list[str] = []
        try:
            for call in (lambda: host.log_paths("job", 1),
                         lambda: host.launch(request(tmp_path, f"open({str(marker)!r}, 'w')", "s.bare.abc")),
                         lambda: _records(host.follow(str(log), 0)),
                         lambda: host.wait_exit(someone)):
                with pytest.raises(HostError) as info:
                    await asyncio.wait_for(call(), 30)
                said.append(str(info.value))
            return said, await host.remote_home()  # the rest of the host still answers
        finally:
            await host.close()

    said, home = run(go)
    where = host.target.display
    line = f"no python3 on {where}: {FIX} (the supervisor's agent, which follows the logs there, runs on it)"
    assert said == [line] * 4
    assert "\n" not in line and home
    assert not marker.exists() and not (tmp_path / "remote-logs").exists()  # nothing ran there, nothing made

    # What the line says works: SUPERVISE_SSH_PYTHON naming a Python 3 on that box, the job runs and is followed.
    cleanup_tags.append("s.bare.ok")
    fixed = SshHost(bare_box.url, env={**ssh_env, **bare_box.env(), "SUPERVISE_SSH_PYTHON": sys.executable})

    async def again() -> tuple[Any, list[Record]]:
        try:
            await fixed.log_paths("job", 1)
            handle = await fixed.launch(request(tmp_path, "print('ran there')", "s.bare.ok"))
            status = await asyncio.wait_for(fixed.wait_exit(handle), 30)
            return status, await _records(fixed.follow(handle.log_path, 0))
        finally:
            await fixed.close()

    status, records = run(again)
    assert status.returncode == 0 and [r.text for r in records] == ["ran there"]


_PYTHON_2 = "#!/bin/sh\necho 'Python 2 prints its version so' >&2\necho 'old 2.7.18'\n"  # what a 2.7 answers MUX_SH


@pytest.mark.parametrize("case", ["missing", "not-executable", "too-old", "not-python"])
def test_a_supervise_ssh_python_that_cannot_run_the_agent_is_refused_in_one_line(ssh_env, tmp_path: Path, url: str,
                                                                               case: str) -> None:
    python = {"missing": "no-such-python3", "not-python": "bash"}.get(case, str(tmp_path / "python"))
    if case == "not-executable":
        (tmp_path / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    if case == "too-old":
        (tmp_path / "python").write_text(_PYTHON_2)
        (tmp_path / "python").chmod(0o755)
    host = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_PYTHON": python})

    async def go() -> tuple[str, bool]:
        try:
            with pytest.raises(HostError) as info:
                await asyncio.wait_for(host.log_paths("job", 1), 30)
            if case != "not-executable":
                return str(info.value), False
            (tmp_path / "python").chmod(0o755)  # fixed on the box: the next use asks again, and runs
            await asyncio.wait_for(host.log_paths("job", 1), 30)
            return str(info.value), True
        finally:
            await host.close()

    line, recovered = run(go)
    where = host.target.display
    expected = {
        "missing": f"SUPERVISE_SSH_PYTHON=no-such-python3 is not found on {where}: set it to a Python 3.8 or newer there",
        "not-executable": rf"{python} on {where} does not run as Python \(.*Permission denied\): {FIX}",
        "too-old": f"{python} on {where} is Python 2.7.18, too old for the supervisor's agent: {FIX}",
        "not-python": rf"bash on {where} does not run as Python \(bash: .*\): {FIX}",
    }[case]
    assert "\n" not in line
    assert line == expected if case in ("missing", "too-old") else re.fullmatch(expected, line), line
    assert recovered == (case == "not-executable")


def test_closing_a_host_ends_a_launch_waiting_for_its_agent(ssh_env) -> None:
    host = SshHost("ssh://root@127.0.0.1:1", env=ssh_env)  # nothing listens: the agent's channel keeps trying

    async def go() -> str:
        waiting = asyncio.create_task(host.log_paths("job", 1))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await host.close()
        with pytest.raises(HostError) as info:
            await asyncio.wait_for(waiting, 10)
        return str(info.value)

    assert run(go) == "the SSH host root@127.0.0.1:1 was closed"


# -- host keys and logins ---------------------------------------------------------------------------

def _refused(env: dict[str, str], url: str, tmp_path: Path) -> str:
    host = SshHost(url, env=env)
    marker = tmp_path / "ran"

    async def go() -> None:
        try:
            await host.launch(request(tmp_path, f"open({str(marker)!r}, 'w')", "s.9.abc"))
        finally:
            await host.close()

    with pytest.raises(HostError) as info:
        run(go)
    assert not marker.exists() and not (tmp_path / "remote-logs").exists()  # nothing ran there
    return str(info.value)


def test_unknown_host_key_is_refused_with_the_command_to_add_it(ssh_env, sshd_server: SshServer, tmp_path: Path, url: str) -> None:
    empty = tmp_path / "known_hosts"
    env = {**ssh_env, "SUPERVISE_SSH_KNOWN_HOSTS": str(empty)}
    port = sshd_server.port
    message = _refused(env, url, tmp_path)
    assert message == (f"host key of 127.0.0.1:{port} is not in known_hosts: verify it and add it with "
                       f"`ssh-keyscan -p {port} 127.0.0.1 >> {empty}`")
    assert "\n" not in message
    # With no known_hosts setting at all: the user's ~/.ssh/known_hosts (here a fake HOME's).
    env.pop("SUPERVISE_SSH_KNOWN_HOSTS")
    env.pop("SUPERVISE_SSH_CONFIG")
    assert _refused(env, url, tmp_path).endswith(f"`ssh-keyscan -p {port} 127.0.0.1 >> ~/.ssh/known_hosts`")


def test_accept_new_records_an_unknown_key_but_never_a_changed_one(ssh_env, sshd_server: SshServer, tmp_path: Path, url: str) -> None:
    known = tmp_path / "kh" / "known_hosts"
    env = {**ssh_env, "SUPERVISE_SSH_KNOWN_HOSTS": str(known)}

    async def connect(url: str, env: dict[str, str]) -> str:
        host = SshHost(url, env=env)
        try:
            return await host.remote_home()
        finally:
            await host.close()

    assert run(lambda: connect(url + "?accept_new_host_key=1", env))
    assert known.read_text().split()[1:] == sshd_server.host_key.with_suffix(".pub").read_text().split()[:2]
    assert run(lambda: connect(url, env))  # now known: no opt-in needed

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known.write_text(f"[127.0.0.1]:{sshd_server.port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    changed = {**env, "SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS": "1"}
    message = _refused(changed, url, tmp_path)
    assert message.startswith(f"host key of 127.0.0.1:{sshd_server.port} has CHANGED")


def test_wrong_user_or_key_is_a_clear_error(ssh_env, sshd_server: SshServer, tmp_path: Path, url: str) -> None:
    message = _refused(ssh_env, f"ssh://nosuchuser@127.0.0.1:{sshd_server.port}", tmp_path)
    assert message.startswith(f"SSH login as nosuchuser to 127.0.0.1:{sshd_server.port} was refused (wrong user or key")
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    message = _refused({**ssh_env, "SUPERVISE_SSH_KEY": str(stranger), "SUPERVISE_SSH_CONFIG": os.devnull},
                       url, tmp_path)
    assert "was refused (wrong user or key" in message and str(stranger) in message


def test_bad_host_urls_are_rejected() -> None:
    for bad in ["ssh://", "http://box", "ssh://box/path", "ssh://box:notaport", "ssh://box?nope=1"]:
        with pytest.raises(HostError):
            parse_target(bad)
    target = parse_target("ssh://me@[::1]:2222?accept_new_host_key=1&log_root=/data/logs")
    assert (target.host, target.port, target.user, target.accept_new, target.log_root) == ("::1", 2222, "me", True, "/data/logs")
    assert target.where == "[::1]:2222"


# -- GPUs ------------------------------------------------------------------------------------------

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=index,pci.bus_id,*) cat "$(dirname "$0")/health.csv" 2>/dev/null || exit 2;;
  --query-gpu=*) printf '0, GPU-aaa, NVIDIA H200, 29640, 143771, 87\\n1, GPU-bbb, NVIDIA H200, 4, 143771, [N/A]\\n';;
  --query-compute-apps=*) printf '4242, GPU-aaa, 29632\\n4343, GPU-bbb, [N/A]\\n';;
  -L) printf 'GPU 0: NVIDIA H200 (UUID: GPU-aaa)\\nGPU 1: NVIDIA H200 (UUID: GPU-bbb)\\n';;
esac
"""


def test_sample_gpus_parses_nvidia_smi_and_says_when_it_is_missing(ssh_env, tmp_path: Path, url: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    with_smi = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_NVIDIA_SMI": str(smi)})
    without = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_NVIDIA_SMI": "/nonexistent/nvidia-smi"})

    async def go() -> tuple[Any, Any]:
        try:
            return await with_smi.sample_gpus(), await without.sample_gpus()
        finally:
            await with_smi.close()
            await without.close()

    sample, missing = run(go)
    assert sample.available
    assert [(d.index, d.uuid, d.used_mib, d.total_mib, d.util_pct) for d in sample.devices] == [
        (0, "GPU-aaa", 29640, 143771, 87), (1, "GPU-bbb", 4, 143771, None)]
    assert [(p.pid, p.gpu_index, p.used_mib) for p in sample.processes] == [(4242, 0, 29632), (4343, 1, None)]
    assert not missing.available
    assert missing.reason == f"nvidia-smi not found on {with_smi.target.display}"


# What nvidia-smi 580 printed for the health query on a healthy H200 (tests/perf/results/stacks-h200),
# then the same board with an uncorrected ECC error, remapped rows pending and a thermal slowdown.
HEALTHY = "0, 00000000:18:00.0, 0, [N/A], No, No, 0x0000000000000001\n1, 00000000:3B:00.0, 0, [N/A], No, No, 0x0000000000000001\n"
FAULTY = "0, 00000000:18:00.0, 1, [N/A], Yes, No, 0x0000000000000001\n1, 00000000:3B:00.0, 0, [N/A], No, No, 0x0000000000000041\n"
DMESG = """#!/bin/sh
[ -e "$(dirname "$0")/refuse" ] && { echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1; }
cat "$(dirname "$0")/kernel.log"
"""


def test_gpu_health_and_kernel_xids_over_ssh_become_faults_only_when_new(ssh_env, tmp_path: Path, url: str) -> None:
    box = tmp_path / "box"
    box.mkdir()
    for name, text in (("nvidia-smi", FAKE_SMI), ("dmesg", DMESG)):
        (box / name).write_text(text)
        (box / name).chmod(0o755)
    (box / "health.csv").write_text(HEALTHY)
    (box / "kernel.log").write_text("[    0.719509] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"
                                    "[   12.000000] NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=old, Graphics Exception\n")
    host = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_NVIDIA_SMI": str(box / "nvidia-smi"),
                             "SUPERVISE_SSH_KERNEL_LOG": str(box / "dmesg")})

    async def go() -> list[Any]:
        samples = [await host.sample_gpus()]  # healthy; the old Xid in the log is not news
        (box / "health.csv").write_text(FAULTY)
        with (box / "kernel.log").open("a") as log:
            log.write("[ 9000.125000] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
                      "GPU has fallen off the bus.\n")
        samples.append(await host.sample_gpus())
        samples.append(await host.sample_gpus())  # nothing new
        (box / "refuse").write_text("")  # dmesg refused (dmesg_restrict): no Xid, the sample still comes
        (box / "health.csv").unlink()  # a driver without the health fields: memory all the same
        samples.append(await host.sample_gpus())
        await host.close()
        return samples

    healthy, faulty, same, bare = run(go)
    assert healthy.available and healthy.devices[1].pci_bus_id == "00000000:3B:00.0"
    assert healthy.devices[0].health.ecc_uncorrected == 0 and healthy.devices[0].health.pages_pending is False
    assert new_faults(None, healthy) == []
    found = {(f.gpu, f.kind.value, f.xid) for f in new_faults(healthy, faulty)}
    assert found == {(1, "xid", 79), (0, "ecc_uncorrected", None), (0, "pages_pending", None), (1, "throttled", None)}
    assert new_faults(faulty, same) == []
    assert bare.available and [d.used_mib for d in bare.devices] == [29640, 4] and bare.xids == ()
    assert bare.devices[0].health is None and new_faults(same, bare) == []


def test_sample_gpus_never_raises_when_the_host_is_unreachable(ssh_env) -> None:
    host = SshHost("ssh://root@127.0.0.1:1", env={**ssh_env, "SUPERVISE_SSH_RETRY_S": "0.5"})

    async def go() -> Any:
        try:
            return await host.sample_gpus()
        finally:
            await host.close()

    sample = run(go)
    assert not sample.available and "cannot sample GPUs on root@127.0.0.1:1" in sample.reason


# -- doctor ------------------------------------------------------------------------------------------

def test_doctor_reports_each_check(ssh_env, sshd_server: SshServer, tmp_path: Path, monkeypatch, capsys, url: str) -> None:
    from supervisor.cli.doctor import doctor_command

    for key, value in ssh_env.items():
        monkeypatch.setenv(key, value)
    assert doctor_command(url) == 0
    out = capsys.readouterr().out
    for name in ("ssh", "host key", "login", "/bin/sh", "setsid", "/proc", "grep -z", "awk", "python3", "log root"):
        assert any(line.startswith("ok") and line[9:].startswith(name) for line in out.splitlines()), (name, out)
    assert "MISSING  nvidia-smi" in out and "SUPERVISE_SSH_NVIDIA_SMI" in out

    # py-spy on the box: found where SUPERVISE_SSH_PYSPY names it, one line saying so where not.
    monkeypatch.setenv("SUPERVISE_SSH_PYSPY", str(Path(sys.executable).parent / "py-spy"))
    assert doctor_command(url) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("ok") and "py-spy" in line and "py-spy 0." in line for line in out.splitlines()), out
    monkeypatch.setenv("SUPERVISE_SSH_PYSPY", "no-such-py-spy")
    assert doctor_command(url) == 0  # optional: the job runs, its stacks are not dumped
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "py-spy" in line and "not found on" in line and "MISSING" in line], out

    # The box's kernel log, where GPU Xid errors are read: readable, or refused with what to do.
    monkeypatch.setenv("SUPERVISE_SSH_KERNEL_LOG", "true")
    assert doctor_command(url) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("ok") and "Xid errors" in line and "`true`" in line], out
    monkeypatch.setenv("SUPERVISE_SSH_KERNEL_LOG", "false")
    assert doctor_command(url) == 0  # optional: memory, ECC and slowdowns are still watched
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("MISSING") and "Xid errors" in line
            and "SUPERVISE_SSH_KERNEL_LOG" in line], out

    # No Python for the agent there: the host's refusal, as `start` would meet it, and a required check.
    monkeypatch.setenv("SUPERVISE_SSH_PYTHON", "no-such-python3")
    assert doctor_command(url) == 1
    out = capsys.readouterr().out
    assert (f"MISSING  python3     SUPERVISE_SSH_PYTHON=no-such-python3 is not found on {parse_target(url).display}: "
            "set it to a Python 3.8 or newer there") in out.splitlines(), out
    assert out.splitlines()[-1].startswith("doctor: 1 required check(s) MISSING: python3")
    monkeypatch.delenv("SUPERVISE_SSH_PYTHON")

    monkeypatch.setenv("SUPERVISE_SSH_KNOWN_HOSTS", str(tmp_path / "empty_known_hosts"))
    assert doctor_command(url) == 1
    out = capsys.readouterr().out
    assert f"MISSING  host key    host key of 127.0.0.1:{sshd_server.port} is not in known_hosts" in out


def test_a_remote_log_and_its_directory_are_private(ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    # A job's log may hold a token it printed (HF_TOKEN): 0700 and 0600 whatever the login's umask.
    cleanup_tags.append("s.perm.abc")
    host = SshHost(url, env=ssh_env)
    logs = tmp_path / "remote-logs" / "job"
    logs.mkdir(parents=True, mode=0o755)
    logs.chmod(0o755)  # left so by an older supervisor: tightened

    async def go() -> ProcessHandle:
        try:
            handle = await host.launch(request(tmp_path, "print('HF_TOKEN=hf_secret')", "s.perm.abc"))
            await asyncio.wait_for(host.wait_exit(handle), timeout=10)
            return handle
        finally:
            await host.close()

    handle = run(go)
    assert Path(handle.log_path).stat().st_mode & 0o777 == 0o600
    assert Path(handle.log_path).parent.stat().st_mode & 0o777 == 0o700


def test_the_pages_log_tail_of_a_remote_log_reads_from_near_its_end(ssh_env, tmp_path: Path, url: str) -> None:
    # It read a remote log from its start: 2.8 s a page load at 150 MB, a time-out past ~1 GB.
    from supervisor.daemon.web._status import _TAIL_BYTES, log_tail

    log = tmp_path / "big.log"
    body = b"".join(f"line {i} {'x' * 90}\n".encode() for i in range(40_000))  # ~4 MB
    log.write_bytes(body)
    host = SshHost(url, env=ssh_env)
    asked: list[int] = []
    follow = host.follow

    def spy(path: str, offset: int):  # the real follower, its starting offset noted
        asked.append(offset)
        return follow(path, offset)

    host.follow = spy  # type: ignore[method-assign]

    async def go():
        try:
            return await log_tail(host, False, 1, str(log), 5, known_end=len(body))
        finally:
            await host.close()

    tail = run(go)
    assert asked == [len(body) - _TAIL_BYTES]
    assert tail.lines == [f"line {i} {'x' * 90}" for i in range(39_995, 40_000)]


# A remote python3 whose agent, on its first run, announces a data frame of 2^40 bytes after its
# hello and then sends nothing: a poisoned or broken agent on the box.  Later runs are the real agent.
_POISONING_PYTHON = """\
import os, subprocess, sys
state, real = {state!r}, {real!r}
if os.path.exists(state) or "def main" not in sys.argv[-1]:  # the version asked first, or a later run
    os.execv(real, [real, *sys.argv[1:]])
open(state, "w").close()
agent = subprocess.Popen([real, *sys.argv[1:]], stdout=subprocess.PIPE)
out = sys.stdout.buffer
out.write(agent.stdout.readline())  # the real agent's hello
out.write(b'{{"ev": "data", "id": 1, "n": 1099511627776}}\\n')
out.flush()
agent.wait()
"""


def test_a_frame_larger_than_the_cap_from_a_real_remote_agent_drops_the_channel_and_following_resumes(
        ssh_env, sshd_server: SshServer, tmp_path: Path, url: str) -> None:
    """Over a real sshd: the daemon never reads 2^40 bytes on the agent's word (memory stays
    where it was, following does not stall): the frame is a protocol error, the channel is
    dropped and the log followed again from its last offset, nothing lost or doubled."""
    python = tmp_path / "poisoning-python3"
    python.write_text(f"#!{sys.executable}\n" + _POISONING_PYTHON.format(state=str(tmp_path / "poisoned"),
                                                                           real=sys.executable))
    python.chmod(0o755)
    path = tmp_path / "job.log"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(50)))
    host = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_PYTHON": str(python)})
    before = psutil.Process().memory_info().rss

    async def go() -> tuple[list[Record], int]:
        try:
            follower = host.follow(str(path), 0)
            records = await asyncio.wait_for(_records(follower, finish_after=3.0), 60)
            return records, host.mux.channels
        finally:
            await host.close()

    with structlog.testing.capture_logs() as logs:
        records, channels = run(go)
    assert [r.text for r in records] == [f"line {i}" for i in range(50)]
    assert channels >= 2  # the poisoned channel, then a good one
    assert any("data frame of 1099511627776 bytes" in str(e.get("error", "")) for e in logs), logs
    assert psutil.Process().memory_info().rss - before < 64 << 20


def test_stacks_of_a_remote_attempt_name_where_it_waits_and_without_py_spy_one_line_says_so(
        ssh_env, tmp_path: Path, cleanup_tags, url: str) -> None:
    cleanup_tags.append("s.stk.abc")
    code = ("import time\ndef remote_frozen_here():\n    print('waiting', flush=True)\n    time.sleep(3600)\n"
            "remote_frozen_here()\n")
    pyspy = str(Path(sys.executable).parent / "py-spy")
    with_spy = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_PYSPY": pyspy})
    without = SshHost(url, env={**ssh_env, "SUPERVISE_SSH_PYSPY": "no-such-py-spy"})

    async def go() -> tuple[Any, Any]:
        try:
            handle = await with_spy.launch(request(tmp_path, code, "s.stk.abc"))
            wait_for_file(Path(handle.log_path))
            dumped = await with_spy.dump_stacks(handle, 10)
            missing = await without.dump_stacks(handle, 10)
            for p in dumped.processes:  # frozen (a stopped rank): read without pausing it, on the box too
                if p.stack:
                    os.kill(p.pid, signal.SIGSTOP)
            stopped = await with_spy.dump_stacks(handle, 10)
            assert any("remote_frozen_here" in (p.stack or "") for p in stopped.processes), stopped
            await with_spy.kill_tree(handle, 1)
            return dumped, missing
        finally:
            await with_spy.close()
            await without.close()

    dumped, missing = run(go)
    assert any("remote_frozen_here" in (p.stack or "") for p in dumped.processes), dumped
    assert "remote_frozen_here" in dumped.summary()
    assert [p.error for p in dumped.processes if not p.stack] == ["not a Python process"] * (len(dumped.processes) - 1)
    assert missing.processes == () and "py-spy not found on" in missing.note


def test_the_program_pid_of_a_remote_attempt_is_its_wrapper_s_child(ssh_env, tmp_path: Path, cleanup_tags,
                                                                      url: str) -> None:
    cleanup_tags.append("s.prog.abc")
    host = SshHost(url, env=ssh_env)

    async def go() -> tuple[ProcessHandle, int | None, int | None]:
        try:
            handle = await host.launch(request(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n",
                                               "s.prog.abc"))
            wait_for_file(Path(handle.log_path))
            found = await host.program_pid(handle)
            # the box is this machine: the pid is the program's (python), a child of the wrapper shell
            assert found is not None and psutil.Process(found).ppid() == handle.pid
            assert "time.sleep(60)" in " ".join(psutil.Process(found).cmdline())
            await host.kill_tree(handle, 1)
            gone = await host.program_pid(handle)
            return handle, found, gone
        finally:
            await host.close()

    handle, found, gone = run(go)
    assert found is not None and found != handle.pid and gone is None
