"""A small read of a busy log is matched on the loop once the attempt's packs have shown they
cost little (jobs/matching.py): no hand-off to the worker thread and back, the same events."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.core.events import Record
from supervisor.jobs import matching
from supervisor.probes import load_packs

_PACKS = ["python", "cuda", "nccl", "vllm", "tqdm", "transformers"]
_LINES = [
    "worker 3: processed batch {i} (4096 tokens)",
    "Loading checkpoint shards:  {p}%|##        | {i}/400 [00:05<00:05,  1.00s/it]",
    "{{'loss': {i}.0, 'learning_rate': 1e-05, 'epoch': 0.1}}",
    "Traceback (most recent call last):",
    '  File "train.py", line {i}, in <module>',
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]


def _reads(n: int, per_read: int = 2) -> list[list[Record]]:
    reads, offset, i = [], 0, 0
    for _ in range(n):
        read = []
        for _ in range(per_read):
            text = _LINES[i % len(_LINES)].format(i=i, p=i % 100)
            read.append(Record(text, offset, offset + len(text) + 1))
            offset += len(text) + 1
            i += 1
        reads.append(read)
    return reads


async def _feed(matcher: matching.Matcher, reads: list[list[Record]]) -> list[object]:
    events: list[object] = []
    for read in reads:
        events.extend((await matcher.feed(read)).events)
    events.extend((await matcher.flush()).events)
    return events


def test_small_reads_are_matched_on_the_loop_once_measured_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matching, "_INLINE_AFTER_BYTES", 2048)
    packs = load_packs(_PACKS)
    reads = _reads(300)

    async def run() -> tuple[list[object], list[object], int, bool]:
        here, worker = matching.Matcher(packs, 0, "here"), matching.Matcher(packs, 0, "worker")
        worker._inline_off = True  # every read through the worker, as before
        try:
            ours = await _feed(here, reads)
            theirs = await _feed(worker, reads)
            return ours, theirs, here._worker.served, here.matches_on_the_loop(200)
        finally:
            here.close()
            worker.close()

    ours, theirs, served, on_loop = asyncio.run(run())
    assert on_loop
    assert served < 60, served  # the first ~2 KiB measured in the worker (and the build, and the flush)
    assert ours == theirs and len(ours) > 100  # the same events, tracebacks across reads included


def test_a_large_read_or_costly_packs_stay_in_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matching, "_INLINE_AFTER_BYTES", 2048)
    packs = load_packs(_PACKS)

    async def run(reads: list[list[Record]]) -> tuple[int, int]:
        m = matching.Matcher(packs, 0, "m")
        try:
            await _feed(m, reads)
            return m._worker.served, len(reads)
        finally:
            m.close()

    big = _reads(40, per_read=200)  # ~9 KiB a read: over _INLINE_BYTES
    served, n = asyncio.run(run(big))
    assert served >= n
    monkeypatch.setattr(matching, "_INLINE_READ_S", 0.0)  # any cost is too much
    served, n = asyncio.run(run(_reads(300)))
    assert served >= n


def test_a_read_that_held_the_loop_too_long_sends_the_rest_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matching, "_INLINE_AFTER_BYTES", 2048)
    monkeypatch.setattr(matching, "_INLINE_HOLD_S", -1.0)  # every read on the loop counts as too long
    packs = load_packs(_PACKS)

    async def run() -> tuple[int, bool]:
        m = matching.Matcher(packs, 0, "m")
        try:
            reads = _reads(300)
            await _feed(m, reads)
            return m._worker.served, m.matches_on_the_loop(200)
        finally:
            m.close()

    served, on_loop = asyncio.run(run())
    assert not on_loop
    assert served >= 298  # one read on the loop, the others in the worker
