"""A log truncated or rotated under a running job: offsets repeat, events must not be lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

from supervisor.core.events import Event, EventKind
from supervisor.hosts.local.follow import LogFollower
from supervisor.store.database import Store

# Fails, waits for gate 1, truncates its own log (stdout is the log, opened for appending),
# waits for gate 2, fails differently at the same offset, exits 1.
TRUNCATING_JOB = """\
import os, sys, time
def fail(exc):
    try:
        raise exc
    except Exception:
        import traceback
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
def wait(path):
    while not os.path.exists(path):
        time.sleep(0.01)
fail(KeyError("the first failure"))
wait(sys.argv[1])
os.ftruncate(1, 0)
wait(sys.argv[2])
fail(ValueError("the second failure, another one"))
sys.exit(1)
"""


def test_a_failure_after_truncation_at_a_reused_offset_is_stored_and_judged(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    gate1, gate2 = home / "gate1", home / "gate2"
    spec = make_job("trunc", TRUNCATING_JOB, params=f', "{gate1}", "{gate2}"')
    client = daemon.client()
    client.start(str(spec), {})

    def failures() -> list[str]:
        return [e.message for e in client.events("trunc", kinds=["failure"]).events]

    wait_until(lambda: any("the first failure" in m for m in failures()))
    gate1.touch()
    wait_until(lambda: "log truncated" in daemon.log_text())
    gate2.touch()
    wait_until(lambda: job_state(client, "trunc") not in ("starting", "running"), timeout=30)
    stored = failures()
    assert any("the first failure" in m for m in stored), stored
    assert any("the second failure" in m for m in stored), stored
    attempt = client.attempts("trunc").attempts[-1]
    assert attempt.failure is not None and "the second failure" in attempt.failure.line, attempt


def test_the_follower_counts_generations_and_resumes_in_one(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\n")

    async def read(offset: int, generation: int) -> list[tuple[str, int, int]]:
        follower = LogFollower(log, offset, generation, use_inotify=False, poll_interval=0.01)

        async def rewrite() -> None:
            log.write_bytes(b"")  # truncated under the follower ...
            while follower.generation == generation:  # ... which notices, then it is written again
                await asyncio.sleep(0.01)
            with open(log, "ab") as f:
                f.write(b"two\n")

        got: list[tuple[str, int, int]] = []
        writer = None
        async for batch in follower.records():
            got += [(r.text, r.offset, r.generation) for r in batch]
            if got[-1][0] == "one":
                writer = asyncio.create_task(rewrite())
            if got[-1][0] == "two":
                follower.finish()
        assert writer is not None
        await writer
        return got

    assert asyncio.run(read(0, 0)) == [("one", 0, 0), ("two", 0, 1)]
    # Resumed in generation 1 at the end of "two": the next record is still generation 1.
    with open(log, "ab") as f:
        f.write(b"three\n")

    async def resume() -> list[tuple[str, int, int]]:
        follower = LogFollower(log, 4, 1, use_inotify=False, poll_interval=0.01)
        follower.finish()
        return [(r.text, r.offset, r.generation) async for batch in follower.records() for r in batch]

    assert asyncio.run(resume()) == [("three", 4, 1)]


def test_store_keeps_events_of_two_generations_at_one_offset(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {}, "running")

    def event(generation: int) -> Event:
        return Event(job="j", attempt=1, kind=EventKind.FAILURE, message=f"gen {generation}", probe="python.tb",
                     offset=0, generation=generation)

    store.record_events([event(0)])
    store.record_events([event(0), event(1)])  # the first is a re-read: stored once
    assert [(e.message, e.generation) for e in store.events("j")] == [("gen 0", 0), ("gen 1", 1)]
    store.close()
