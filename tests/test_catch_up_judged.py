"""A re-adopted attempt is judged only on lines read: while the backlog its log gathered with no
daemon watching is still being read, its stored past says nothing of how it goes now.

The stored record of the bar ends at the step the stopped daemon last saw, long ago by now, while
the backlog holds the steps it has made since.  A judgement taken before that backlog is read
sent `slow at sample 128/640` for a remote job 0.01 s before its missed lines were read.  A
backlog is usually read before the watch first looks, so here its reading stands still after a
first step (a step: 256 records; the backlog is some 2,000, each dated by its place in the log),
as a slow remote read does, and meanwhile the watch is woken: by an operator's `hold`, as a GPU
sample wakes it on a GPU host.  A real daemon process runs the job (a real child writing its log)
and is SIGKILLed; the daemon that re-adopts the attempt runs in this process (its real store, its
real local host), where the attempt's matcher can be held.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state
from in_process import serving

from supervisor.core.config import DaemonSettings, Paths
from supervisor.core.events import Record
from supervisor.daemon.service import Service
from supervisor.jobs.matching import Matched, Matcher
from supervisor.store.database import Store

# A bar of 10 steps a second, each step after 50 lines of chatter (~510 records a second); it ends
# (exit 0) at the step after the `finish` file appears.
CHATTY_BAR = """\
import os, sys, time
finish = sys.argv[1]
n = 1000
for i in range(1, n + 1):
    sys.stdout.write("".join(f"worker {i}.{j}: batch ok\\n" for j in range(50)))
    sys.stdout.write(f"Loading checkpoint shards: {i * 100 // n}%|###| {i}/{n} [00:00<00:01, 10.0it/s]\\n")
    sys.stdout.flush()
    if os.path.exists(finish):
        break
    time.sleep(0.1)
"""
SLOW_FLOOR_S = 2.0  # a step is slow once it has lasted this (its history says 0.1 s)
DOWN_S = 4.0  # no daemon for this long: the last step the stored record shows is this old
SETTLE_S = 0.3  # the reading stands still this long after the operator's verb is answered


def _slow_reports(store: Store, job: str, n: int) -> list[str]:
    return [e.message for e in store.events(job, attempt=n, kinds=["action"]) if e.message.startswith("slow")]


def test_a_readopted_attempt_is_not_reported_slow_on_its_stored_past_while_its_backlog_is_read(
        daemon: DaemonProcess, make_job, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finish = home / "finish"
    spec = make_job("chatty", CHATTY_BAR, params=f', "{finish}"',
                    extra=f"[health]\nstall_floor_s = 60\nslow_floor_s = {SLOW_FLOOR_S}\n")
    # A first run gives the bar its history (0.1 s a step); a second runs on past the daemon's SIGKILL.
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: len(client.events("chatty", attempt=1, kinds=["progress"]).events) >= 3)
    finish.touch()
    wait_until(lambda: job_state(client, "chatty") == "done")
    finish.unlink()
    client.start(str(spec), {})
    wait_until(lambda: len(client.events("chatty", attempt=2, kinds=["progress"]).events) >= 2)
    daemon.kill(signal.SIGKILL)
    killed_at = time.time()  # the attempt runs on, its log unread
    wait_until(lambda: time.time() - killed_at > DOWN_S)

    # The daemon that re-adopts the attempt runs in this process.  Its reading of the backlog stands
    # still after a first step, and meanwhile an operator's `hold` wakes the watch (as a GPU sample
    # does on a GPU host): a watch woken while the backlog is unread must wait on.
    fed: dict[int, int] = {}  # steps fed, by matcher
    held, answered = asyncio.Event(), asyncio.Event()
    real_feed = Matcher.feed

    async def feed(self: Matcher, records: Sequence[Record]) -> Matched:
        fed[id(self)] = fed.get(id(self), 0) + 1
        if fed[id(self)] == 2:
            held.set()
            await asyncio.wait_for(answered.wait(), 30)
            await asyncio.sleep(SETTLE_S)  # the watch has had its turn
        return await real_feed(self, records)

    monkeypatch.setattr(Matcher, "feed", feed)

    async def until(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s")
            await asyncio.sleep(0.02)

    async def readopted() -> tuple[list[str], list[str]]:
        service = Service(Paths(home), DaemonSettings())
        store = service.store
        async with serving(service) as client:
            up_at = time.time()
            await asyncio.wait_for(held.wait(), 30)
            await asyncio.to_thread(client.hold, "chatty")
            answered.set()
            # Read past its backlog: a step written after the re-adoption is stored.
            await until("the backlog read", lambda: any(
                e.ts > up_at for e in store.events("chatty", attempt=2, kinds=["progress"], limit=5, latest=True)))
            finish.touch()
            await until("the end", lambda: not store.attempts("chatty")[-1].state.active)
            verdicts = [e.message for e in store.events("chatty", attempt=2, kinds=["verdict"])]
            return _slow_reports(store, "chatty", 2), verdicts

    slow, verdicts = asyncio.run(readopted())
    assert len(fed) == 1 and min(fed.values()) > 2  # the re-adopted attempt's reading was held at its second step
    # Its bar moved every 0.1 s throughout: neither slow nor stalled, by what its log says.
    assert slow == [] and verdicts == ["done: exited 0"], (slow, verdicts)
