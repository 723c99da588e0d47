"""The async log follower, on real files and real writer processes.

Every behaviour runs twice where it matters: driven by inotify (with its timers pushed out
to a minute, so only events can make the test pass in time) and by forced polling.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import sys
import textwrap
import tracemalloc
from collections.abc import Callable, Coroutine
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog

from supervisor.core.events import Record
from supervisor.core.records import MAX_RECORD_BYTES
from supervisor.hosts import _inotify
from supervisor.hosts.local.follow import LogFollower

T = TypeVar("T")

MODES: dict[str, dict[str, Any]] = {
    "inotify": {"use_inotify": True, "poll_interval": 60.0, "safety_interval": 60.0},
    "polling": {"use_inotify": False, "poll_interval": 0.01},
}
mode_param = pytest.mark.parametrize("mode", list(MODES))

WAIT_S = 5.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Check ``condition`` at every turn of the event loop until it holds or time runs out."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


class Collector:
    """Drains a follower in a background task, recording everything it yields."""

    def __init__(self, follower: LogFollower) -> None:
        self.follower = follower
        self.records: list[Record] = []
        self.batches = 0
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for batch in self.follower.records():
            assert batch, "empty batches are never yielded"
            self.batches += 1
            self.records.extend(batch)

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.records]

    async def wait_texts(self, expected: list[str]) -> None:
        def complete() -> bool:
            if self.task.done():
                self.task.result()  # surface a crash of the follower
            return len(self.records) >= len(expected)

        await until(complete, f"records {expected!r}")
        assert self.texts == expected

    async def finish(self) -> list[Record]:
        self.follower.finish()
        await asyncio.wait_for(self.task, WAIT_S)
        return self.records


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def assert_contiguous(records: list[Record], start: int = 0) -> None:
    position = start
    for record in records:
        assert record.offset == position, record
        position = record.end


# -- the basics ---------------------------------------------------------------------------


@mode_param
def test_lines_are_yielded_as_written_and_partial_lines_held(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        append(path, b"alpha\nbeta\n")
        await got.wait_texts(["alpha", "beta"])
        assert follower.using_inotify is (mode == "inotify")
        append(path, b"gam")
        await until(lambda: follower.buffered == 3, "the partial line to be read")
        assert got.texts == ["alpha", "beta"] and follower.offset == 11
        append(path, b"ma\n")
        await got.wait_texts(["alpha", "beta", "gamma"])
        assert follower.offset == path.stat().st_size == 17
        assert_contiguous(await got.finish())

    run(main())


@mode_param
def test_carriage_return_progress_arrives_as_redraws(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"")
    bars = [b"\r  0%|          | 0/4", b"\r 50%|#####     | 2/4", b"\r100%|##########| 4/4"]

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        for bar in bars:
            append(path, bar)
        append(path, b"\nLoaded\n")
        await got.wait_texts(["", "  0%|          | 0/4", " 50%|#####     | 2/4", "100%|##########| 4/4", "Loaded"])
        assert [r.redraw for r in got.records] == [True, True, True, False, False]
        await got.finish()

    run(main())


@mode_param
def test_crlf_split_across_reads_is_one_newline(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        append(path, b"first\r")
        # The follower must hold the \r back: it may be half of \r\n.
        await until(lambda: follower.buffered == 6, "the held-back carriage return")
        assert got.records == []
        append(path, b"\nsecond\r\n")
        await got.wait_texts(["first", "second"])
        assert [r.redraw for r in got.records] == [False, False]
        assert got.records[1] == Record("second", 7, 15)
        # A held \r followed by anything but \n is a redraw, even with no terminator after it.
        append(path, b" 50%\r")
        await until(lambda: follower.buffered == 5, "the held-back carriage return")
        append(path, b" 60%")
        await got.wait_texts(["first", "second", " 50%"])
        assert got.records[2].redraw
        assert (await got.finish())[-1] == Record(" 60%", 20, 24)

    run(main())


def test_invalid_utf8_and_nul_bytes(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"ok\n")

    async def main() -> None:
        follower = LogFollower(path, **MODES["inotify"])
        got = Collector(follower)
        append(path, b"bad \xc3\x28 \xff\n\x00nul\x00\n")
        # A NUL run is a record boundary and no text (a log truncated under its writer).
        await got.wait_texts(["ok", "bad \ufffd( \ufffd", "nul", ""])
        await got.finish()

    run(main())


# -- bounded memory -----------------------------------------------------------------------

LONG_BLOCK = ("0123456789abcdef-é-€-" * 3000).encode()  # multi-byte characters land on cuts
LONG_BLOCKS = 50 * (1 << 20) // len(LONG_BLOCK) + 1  # a little over 50 MB


def test_50mb_line_without_newline_is_cut_and_memory_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    chunk_size = 1 << 20
    writer = textwrap.dedent(
        f"""
        import sys
        block = ("0123456789abcdef-é-€-" * 3000).encode()
        with open(sys.argv[1], "ab") as log:
            for _ in range({LONG_BLOCKS}):
                log.write(block)
                log.flush()
        """
    )
    expected = hashlib.sha256()
    for _ in range(LONG_BLOCKS):
        expected.update(LONG_BLOCK)

    async def main() -> tuple[int, int]:
        follower = LogFollower(path, chunk_size=chunk_size, **MODES["inotify"])
        digest = hashlib.sha256()
        pieces: list[tuple[int, bool, int, int]] = []

        async def consume() -> None:
            async for batch in follower.records():
                for record in batch:
                    data = record.text.encode()
                    digest.update(data)
                    pieces.append((len(data), record.cut, record.offset, record.end))
                del batch  # hold one batch at a time, as a real consumer does

        tracemalloc.start()
        try:
            task = asyncio.create_task(consume())
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", writer, str(path))
            assert await proc.wait() == 0
            follower.finish()
            await asyncio.wait_for(task, 20)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert digest.hexdigest() == expected.hexdigest()  # the pieces reassemble to the line
        assert all(cut for _, cut, _, _ in pieces[:-1]) and not pieces[-1][1]
        assert all(size <= MAX_RECORD_BYTES for size, _, _, _ in pieces)
        assert pieces[-1][3] == follower.offset == LONG_BLOCKS * len(LONG_BLOCK)
        assert all(a[3] == b[2] for a, b in pairwise(pieces))
        return follower.peak_buffer, peak

    peak_buffer, traced_peak = run(main())
    assert peak_buffer <= chunk_size + MAX_RECORD_BYTES + 1
    assert traced_peak < 16 * (1 << 20), f"traced peak {traced_peak / 2**20:.1f} MiB"


# -- truncation and rotation --------------------------------------------------------------


@mode_param
def test_truncation_under_the_follower_restarts_from_zero(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> LogFollower:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        with open(path, "ab", buffering=0) as writer:  # O_APPEND, as the launch wrapper's >>
            writer.write(b"one\ntwo\npart")
            await got.wait_texts(["one", "two"])
            await until(lambda: follower.buffered == 4, "the partial line")
            open(path, "wb").close()  # `> job.log` from a shell
            await until(lambda: follower.truncations == 1, "the truncation to be seen")
            writer.write(b"three\n")
            await got.wait_texts(["one", "two", "part", "three"])
        assert got.records[3] == Record("three", 0, 6, generation=1)  # offsets repeat after a truncation: a new generation
        assert follower.offset == 6
        await got.finish()
        return follower

    with structlog.testing.capture_logs() as logs:
        follower = run(main())
    assert follower.truncations == 1
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "truncated" in warnings[0]["event"]


@mode_param
def test_a_truncation_hidden_by_more_output_between_two_looks_is_still_a_truncation(tmp_path: Path, mode: str) -> None:
    """The log is cut and rewritten longer than it was before the follower looks again (a
    job's `ftruncate(1, 0)` then a burst, logrotate's copytruncate of a busy log): the size
    alone reads as growth; the bytes before the read position tell."""
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> tuple[LogFollower, Collector]:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        with open(path, "ab", buffering=0) as writer:
            writer.write(b"first line\nsecond line\n")
            await got.wait_texts(["first line", "second line"])
        # No await in between: the follower cannot look until both are done.
        with open(path, "wb", buffering=0) as rewriter:
            rewriter.write(b"Traceback (most recent call last): a longer first line after the cut\n")
        await got.wait_texts(["first line", "second line",
                              "Traceback (most recent call last): a longer first line after the cut"])
        await got.finish()
        return follower, got

    follower, got = run(main())
    assert follower.truncations == 1
    assert got.records[2].offset == 0 and got.records[2].generation == 1


@mode_param
def test_rotation_finishes_the_old_file_then_follows_the_new(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        with open(path, "ab", buffering=0) as old:
            old.write(b"old1\nold2\n")
            await got.wait_texts(["old1", "old2"])
            path.rename(tmp_path / "job.log.1")
            old.write(b"old3\nold-tail")  # the writer has not reopened yet
            append(path, b"new1\n")
        await got.wait_texts(["old1", "old2", "old3", "old-tail", "new1"])
        assert follower.rotations == 1
        assert got.records[-1] == Record("new1", 0, 5, generation=1)
        assert_contiguous(got.records[:4])
        append(path, b"new2\n")
        await got.wait_texts(["old1", "old2", "old3", "old-tail", "new1", "new2"])
        await got.finish()

    run(main())


@mode_param
def test_file_deleted_and_recreated(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"a\n")

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        await got.wait_texts(["a"])
        path.unlink()
        path.write_bytes(b"b\n")
        await got.wait_texts(["a", "b"])
        assert follower.rotations == 1
        await got.finish()

    run(main())


# -- starting points ----------------------------------------------------------------------

MIXED = (
    b"plain line\n"
    b"crlf line\r\n"
    b"\r 10%|#\r 20%|##\r100%|####\n"
    b"bad \xff utf8 \x00 nul\n"
    + b"L" * (MAX_RECORD_BYTES + 5000)
    + b"\n"
    + b"".join(b"line %d\n" % i for i in range(200))
    + b"no newline at the end"
)


def test_resume_from_an_offset_equals_the_tail_of_a_full_run(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(MIXED)

    async def follow_all(offset: int) -> list[Record]:
        got = Collector(LogFollower(path, offset, **MODES["inotify"]))
        return await got.finish()

    full = run(follow_all(0))
    assert_contiguous(full)
    assert full[-1].end == len(MIXED) and full[-1].text == "no newline at the end"
    for index in (0, 1, 3, 6, 7, 8, 100, len(full) - 2):
        assert run(follow_all(full[index].end)) == full[index + 1 :], index


@mode_param
def test_restarted_follower_continues_exactly(tmp_path: Path, mode: str) -> None:
    """A daemon restart: stop one follower mid-line, write while nobody follows, resume."""
    path = tmp_path / "job.log"
    path.write_bytes(b"")

    async def main() -> list[Record]:
        first = LogFollower(path, **MODES[mode])
        got = Collector(first)
        append(path, b"one\ntwo\r\nthr")
        await got.wait_texts(["one", "two"])
        await until(lambda: first.buffered == 3, "the partial line")
        await first.aclose()
        await asyncio.wait_for(got.task, WAIT_S)
        assert first.offset == 9
        append(path, b"ee\nfour\n")
        second = Collector(LogFollower(path, first.offset, **MODES[mode]))
        append(path, b"five\n")
        await second.wait_texts(["three", "four", "five"])
        return got.records + await second.finish()

    records = run(main())
    assert [r.text for r in records] == ["one", "two", "three", "four", "five"]
    assert_contiguous(records)


@mode_param
def test_file_created_after_following_starts(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "attempt-1.log"

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        await asyncio.sleep(0)
        append(path, b"hello\n")
        await got.wait_texts(["hello"])
        await got.finish()

    run(main())


@mode_param
def test_directory_created_after_following_starts(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job" / "deeper" / "attempt-1.log"

    async def main() -> None:
        follower = LogFollower(path, **MODES[mode])
        got = Collector(follower)
        await asyncio.sleep(0)
        path.parent.mkdir(parents=True)
        append(path, b"hello\n")
        await got.wait_texts(["hello"])
        await got.finish()

    run(main())


def test_finish_when_the_file_never_appeared(tmp_path: Path) -> None:
    async def main() -> list[Record]:
        return await Collector(LogFollower(tmp_path / "never.log", **MODES["inotify"])).finish()

    assert run(main()) == []


def test_stored_offset_past_the_end_counts_as_truncation(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"fresh\n")

    async def main() -> LogFollower:
        follower = LogFollower(path, 1000, **MODES["inotify"])
        assert [r.text for r in await Collector(follower).finish()] == ["fresh"]
        return follower

    with structlog.testing.capture_logs():
        assert run(main()).truncations == 1


# -- a real writer process ----------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    with open(sys.argv[1], "a") as log:
        for i in range(100):
            log.write(f"step {i}\\n")
            log.flush()
            if i % 10 == 0:
                for pct in (0, 50, 100):
                    log.write(f"\\rshard {i}: {pct}%")
                    log.flush()
                log.write("\\n")
                time.sleep(0.002)
        log.write("Traceback tail without newline")
    """
)


def writer_expected() -> list[str]:
    texts: list[str] = []
    for i in range(100):
        texts.append(f"step {i}")
        if i % 10 == 0:
            texts += ["", f"shard {i}: 0%", f"shard {i}: 50%", f"shard {i}: 100%"]
    return [*texts, "Traceback tail without newline"]


@mode_param
def test_writer_process_followed_until_exit_then_finish(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "job.log"

    async def main() -> list[Record]:
        got = Collector(LogFollower(path, **MODES[mode]))
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, str(path))
        assert await proc.wait() == 0
        return await got.finish()

    records = run(main())
    assert [r.text for r in records] == writer_expected()
    assert_contiguous(records)
    assert records[-1].end == path.stat().st_size
    assert sum(r.redraw for r in records) == 30


# -- lifecycle and shared resources -------------------------------------------------------


def inotify_fds() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify")


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_aclose_ends_iteration_and_releases_everything(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"x\n")
    fds_before = len(os.listdir("/proc/self/fd"))

    async def main() -> None:
        follower = LogFollower(path, **MODES["inotify"])
        got = Collector(follower)
        await got.wait_texts(["x"])
        await follower.aclose()
        await asyncio.wait_for(got.task, WAIT_S)
        # Closing one that is suspended at a yield, and one never iterated.
        suspended = LogFollower(path, **MODES["inotify"])
        iterator = suspended.records()
        assert [r.text for r in await iterator.__anext__()] == ["x"]
        await suspended.aclose()
        await LogFollower(path).aclose()

    run(main())
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_followers_share_one_inotify_instance(tmp_path: Path) -> None:
    paths = [tmp_path / f"job{i}.log" for i in range(4)]

    async def main() -> None:
        followers = [LogFollower(p, **MODES["inotify"]) for p in [*paths, paths[0]]]
        collectors = [Collector(f) for f in followers]
        for p in paths:
            append(p, p.name.encode() + b"\n")
        for c, p in zip(collectors, [*paths, paths[0]], strict=True):
            await c.wait_texts([p.name])
        assert inotify_fds() == 1
        # Two followers share one kernel watch on job0.log: closing one must not blind the other.
        await followers[0].aclose()
        append(paths[0], b"more\n")
        await collectors[-1].wait_texts(["job0.log", "more"])
        for c in collectors[1:]:
            await c.finish()

    run(main())
    assert inotify_fds() == 0


def test_falls_back_to_polling_when_inotify_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(loop: asyncio.AbstractEventLoop) -> _inotify.WatchHub:
        raise OSError(errno.EMFILE, "too many inotify instances")

    monkeypatch.setattr(_inotify, "hub_for", unavailable)
    path = tmp_path / "job.log"

    async def main() -> None:
        follower = LogFollower(path, poll_interval=0.01)
        got = Collector(follower)
        append(path, b"polled\n")
        await got.wait_texts(["polled"])
        assert not follower.using_inotify
        await got.finish()

    with structlog.testing.capture_logs():
        run(main())


def test_records_can_be_iterated_once(tmp_path: Path) -> None:
    follower = LogFollower(tmp_path / "job.log")
    follower.records()
    with pytest.raises(RuntimeError):
        follower.records()


def test_parse_events_reads_names_and_padding() -> None:
    import struct

    raw = struct.pack("iIII", 1, _inotify.IN_CREATE, 0, 16) + b"job.log".ljust(16, b"\0")
    raw += struct.pack("iIII", 2, _inotify.IN_MODIFY, 0, 0)
    assert _inotify.parse_events(raw) == [
        _inotify.InotifyEvent(1, _inotify.IN_CREATE, 0, b"job.log"),
        _inotify.InotifyEvent(2, _inotify.IN_MODIFY, 0, b""),
    ]



def test_inotify_read_gives_each_distinct_event_once(tmp_path: Path) -> None:
    """Logs written in turn queue one IN_MODIFY per write (the kernel merges only repeats in a
    row); a read hands each distinct event over once, so busy logs cost one dispatch each."""
    inotify = _inotify.Inotify()
    try:
        paths = [tmp_path / "a.log", tmp_path / "b.log"]
        wds = []
        for path in paths:
            path.write_bytes(b"")
            wds.append(inotify.add_watch(path, _inotify.IN_MODIFY))
        for _ in range(50):
            for path in paths:
                with open(path, "ab") as f:
                    f.write(b"line\n")
        events = inotify.read_events()
        assert [(e.wd, e.mask) for e in events] == [(wd, _inotify.IN_MODIFY) for wd in wds]
    finally:
        inotify.close()
