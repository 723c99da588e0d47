"""An SSH host at fleet size: every follow and exit watch of a host on one agent channel.

Against a real OpenSSH server (tests/sshd.py) whose ``MaxSessions`` is 4: ten attempts on one
host are all launched, followed at the same time to their last line and seen to exit, over
one connection, where a channel per followed log would be refused after the fourth session.  Also: a log
truncated or replaced under the agent's follow starts a new generation at 0, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from supervisor.core.events import Record
from supervisor.hosts.base import LaunchRequest
from supervisor.hosts.ssh.host import SshHost

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]

ATTEMPTS = 10
# Each attempt writes until the test says go, which it does once every attempt is followed:
# all ten follows are then live at once.
CODE = ("import os, sys, time\n"
        "n, go = int(sys.argv[1]), sys.argv[2]\n"
        "i = 0\n"
        "while not os.path.exists(go) and i < 600:\n"
        "    print(f'attempt {n} step {i}', flush=True)\n"
        "    time.sleep(0.05)\n"
        "    i += 1\n"
        "print(f'attempt {n} done', flush=True)\n"
        "sys.exit(n)\n")


@pytest.fixture
def small_sshd(tmp_path: Path) -> Iterator[SshServer]:
    from sshd import SshServer  # the plugin module, imported (and assertion-rewritten) by now

    with SshServer(tmp_path / "sshd", max_sessions=4) as server:
        yield server


@pytest.fixture
def tags() -> Iterator[list[str]]:
    found: list[str] = []
    yield found
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("SUPERVISE_ATTEMPT") in found:
                proc.kill()


def _env(server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return {**server.env(), "SUPERVISE_SSH_LOG_ROOT": str(tmp_path / "remote-logs"), "SUPERVISE_SSH_RETRY_S": "5"}


def test_ten_attempts_on_a_host_allowing_four_sessions_are_all_followed_and_their_exits_seen(
        small_sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tags: list[str]) -> None:
    host = SshHost(small_sshd.url, env=_env(small_sshd, tmp_path, monkeypatch))
    go_file = tmp_path / "go"
    following: set[int] = set()

    async def one(n: int) -> tuple[list[str], int | None]:
        tag = f"fleet.{n}.t"
        tags.append(tag)
        log_path, status_path = await host.log_paths("fleet", n)
        handle = await host.launch(LaunchRequest(
            argv=[sys.executable, "-c", CODE, str(n), str(go_file)], workdir=str(tmp_path), env={"PYTHONUNBUFFERED": "1"},
            log_path=log_path, status_path=status_path, tag=tag))
        follower = host.follow(log_path, 0)
        lines: list[str] = []

        async def read() -> None:
            async for batch in follower.records():
                lines.extend(r.text for r in batch)
                following.add(n)
                if len(following) == ATTEMPTS:
                    go_file.touch()

        reader = asyncio.create_task(read())
        status = await host.wait_exit(handle)
        follower.finish()
        await asyncio.wait_for(reader, 30)
        await follower.aclose()
        return lines, status.returncode

    async def go() -> tuple[list[tuple[list[str], int | None]], int, int]:
        try:
            results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(1, ATTEMPTS + 1))), 60)
            return results, host.connects, host.mux.channels
        finally:
            await host.close()

    results, connects, agent_channels = asyncio.run(go())
    for n, (lines, code) in enumerate(results, start=1):
        assert lines == [f"attempt {n} step {i}" for i in range(len(lines) - 1)] + [f"attempt {n} done"]
        assert code == n
    assert connects == 1 and agent_channels == 1  # one connection, one agent channel for all of them
    assert "refused" not in small_sshd.log_text().lower()


def test_a_truncated_or_replaced_log_starts_a_new_generation_in_order(
        sshd_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = SshHost(sshd_server.url, env=_env(sshd_server, tmp_path, monkeypatch))
    path = tmp_path / "rotating.log"
    path.write_text("one\ntwo\n")

    async def go() -> tuple[list[Record], int]:
        follower = host.follow(str(path), 0)
        out: list[Record] = []

        async def read() -> None:
            async for batch in follower.records():
                out.extend(batch)

        async def until(count: int) -> None:
            while len(out) < count:
                await asyncio.sleep(0.01)

        reader = asyncio.create_task(read())
        try:
            await asyncio.wait_for(until(2), 10)
            path.write_text("x\n")  # truncated, then shorter content
            await asyncio.wait_for(until(3), 10)
            replacement = tmp_path / "rotating.new"
            replacement.write_text("fresh\n")
            replacement.replace(path)  # another file at the same path
            await asyncio.wait_for(until(4), 10)
            follower.finish()
            await asyncio.wait_for(reader, 10)
            return out, follower.truncations
        finally:
            await follower.aclose()
            await host.close()

    records, truncations = asyncio.run(go())
    assert [(r.text, r.offset, r.generation) for r in records] == [
        ("one", 0, 0), ("two", 4, 0), ("x", 0, 1), ("fresh", 0, 2)]
    assert truncations == 2
