"""Differential fuzzing of reading: every shortcut of ``supervise probe``, and the daemon's live reading,
against the plainest reader.

    .venv/bin/python tests/perf/fuzz_reading.py [--seconds 60] [--workers N] [--seed S] [--keep DIR]

The plainest reader (``reference``) reads the whole file as one chunk, splits every record, coalesces
``\\r`` redraws as the report does, and feeds the engine record by record with the prefilter off and no
fold of a bar's run.  Each case is a random log built from the corpus's own lines (tests/data/corpus),
mutated the ways real logs are (tqdm redraws by the thousand, prefixes alone on a line, tracebacks, ANSI
colours inside a match, NUL holes, CRLF, bytes that are not UTF-8, records over the 1 MiB limit, a last
line with no newline), then read by ``replay_file`` as ``supervise probe`` reads it, in random chunk sizes,
with the prefilter on and off, with quiet lines skipped and not: the report (JSON and text) must be the
reference's, byte for byte.

The live reading is compared too, event by event: the log cut into random-sized writes, completed into
records by a follower's ``RecordBuffer``, each read's batch given to an attempt's ``Matcher`` (the engine
in its worker thread, batches cut at 16 KiB), the prefilter on or off, against the reference engine's
events record by record (no coalescing: the daemon reads every redraw).

A case that differs, or that raises, is written to ``--keep`` (default: a temporary directory) under its
seed, and the run exits 1.  Not a test of the suite: a campaign run for minutes, across cores; the suite's
own random cases are tests/test_probes_quiet.py and tests/test_probes_fold.py.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.core.events import ProbeEvent
from supervisor.core.records import RecordBuffer, split_records
from supervisor.jobs.matching import Matcher
from supervisor.probes import ProbeEngine, _replay, load_packs
from supervisor.probes._barfold import RedrawCoalescer

CORPUS = ROOT / "tests" / "data" / "corpus"
_PREFIXES = [b"(VllmWorker rank=0 pid=79) ", b"[rank1]: ", b"[default0]:", b"(EngineCore_DP0 pid=494) ",
             b"2026-12-04T10:00:00.123Z ", b"[1,0]<stdout>:"]


def corpus_lines() -> list[bytes]:
    lines: set[bytes] = set()
    for path in sorted(CORPUS.rglob("*.log")):
        lines.update(line for line in path.read_bytes().split(b"\n") if len(line) < 4000)
    return sorted(lines)


def _bar(rng: random.Random) -> bytes:
    """One tqdm bar redrawn with ``\\r`` (thousands of times, sometimes), as tqdm writes to a file."""
    total = rng.choice([3, 13, 64, 500, 5000])
    step = rng.choice([1, 1, 3, 17])
    desc = rng.choice([b"Loading safetensors checkpoint shards", b"Map", b"Processed prompts", b"",
                       b"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"])
    draws = []
    for done in range(0, total + 1, step):
        pct = 100 * done // total
        bar = ("\u2588" * (pct // 10)).ljust(10).encode() if rng.random() < 0.5 else (b"#" * (pct // 10)).ljust(10)
        draws.append(desc + (b": " if desc else b"") + f"{pct:3d}%|".encode() + bar
                     + f"| {done}/{total} [00:01<00:02,  3.{done % 10}it/s]".encode())
    if rng.random() < 0.2:
        draws.insert(rng.randrange(len(draws)), b"")  # a blank redraw
    end = rng.choice([b"\n", b"\r\n", b"\r", b"\r\n"])
    return b"\r".join(draws) + end


def random_log(rng: random.Random, lines: list[bytes]) -> bytes:
    out: list[bytes] = []
    quiet = rng.choice([0.0, 0.5, 0.9, 0.99])
    filler = [b"2026-12-04 12:00:01 worker 3 wrote block 17 of 40", b"    x = model(batch)", b"",
              b"some words with no event in them"]
    for _ in range(rng.randint(20, 1500)):
        roll = rng.random()
        end = b"\r\n" if rng.random() < 0.05 else b"\n"
        if roll < quiet:
            out.append(rng.choice(filler) + end)
        elif roll < quiet + (1 - quiet) * 0.55:
            out.append(rng.choice(lines) + end)
        elif roll < quiet + (1 - quiet) * 0.65:
            out.append(_bar(rng))
        elif roll < quiet + (1 - quiet) * 0.72:  # a prefix alone lends its fields to the next line
            out.append(rng.choice(_PREFIXES).rstrip() + b"\n" + rng.choice(lines) + end)
        elif roll < quiet + (1 - quiet) * 0.8:  # a prefixed run of corpus lines (a worker's traceback, say)
            prefix = rng.choice(_PREFIXES)
            start = rng.randrange(len(lines))
            out += [prefix + line + end for line in lines[start:start + rng.randint(2, 12)]]
        elif roll < quiet + (1 - quiet) * 0.85:  # colours, around a line or inside a match
            line = rng.choice(lines)
            cut = rng.randint(0, len(line))
            out.append(line[:cut] + rng.choice([b"\x1b[1m", b"\x1b[0m", b"\x1b[32m", b"\x1b[2K"]) + line[cut:] + end)
        elif roll < quiet + (1 - quiet) * 0.88:  # a hole of NULs
            out.append(b"\x00" * rng.choice([1, 7, 300, 70_000]) + rng.choice(lines) + end)
        elif roll < quiet + (1 - quiet) * 0.91:  # not UTF-8, or cut inside a character
            line = rng.choice(lines) + "\u2588\u00e9".encode()
            out.append(line[: rng.randint(0, len(line))] + rng.choice([b"\xff", b"\xc3", b"\xe2\x96", b""]) + end)
        elif roll < quiet + (1 - quiet) * 0.93:  # long, now and then over the 1 MiB record limit
            size = rng.choice([3000, 70_000, (1 << 20) + rng.randint(-5, 5)])
            out.append(rng.choice([b"x", b"\r", b"ab\r"]) * (size // 2) + rng.choice(lines) + end)
        elif roll < quiet + (1 - quiet) * 0.96:  # two lines glued (a redraw the next line was written after)
            out.append(rng.choice(lines) + rng.choice(lines) + end)
        else:
            out.append(rng.choice(lines)[: rng.randint(0, 60)] + b"\r" + rng.choice(lines) + end)
    data = b"".join(out)
    return data if rng.random() < 0.8 else data.rstrip(b"\n")


@contextmanager
def _prefilter(*, on: bool) -> Iterator[None]:
    """The engines built inside use the prefilter or not (``SUPERVISE_PREFILTER=off``, read as each is built)."""
    if not on:
        os.environ["SUPERVISE_PREFILTER"] = "off"
    try:
        yield
    finally:
        os.environ.pop("SUPERVISE_PREFILTER", None)


def reference(path: Path) -> tuple[str, str]:
    """The plainest reading: one chunk, every record, the prefilter off, no fold."""
    with _prefilter(on=False):
        engine = ProbeEngine(load_packs(), fold_runs=False)
    summary = _replay._Summary()
    bars = RedrawCoalescer()
    records, _ = split_records(path.read_bytes(), 0, True)
    for record in bars.feed(records):
        summary.add(engine.feed(record))
    for record in bars.flush():
        summary.add(engine.feed(record))
    summary.add(engine.flush())
    report = summary.report()
    return report.to_json(), report.render_text()


def _event_key(event: ProbeEvent) -> tuple[object, ...]:
    failure = event.failure
    return (event.offset, event.probe, event.kind.value, event.phase, repr(sorted(event.fields.items())),
            None if failure is None else (failure.kind, failure.line, failure.fingerprint))


def reference_events(path: Path) -> list[tuple[object, ...]]:
    """Every event of the plainest reading, record by record, the prefilter off."""
    with _prefilter(on=False):
        engine = ProbeEngine(load_packs())
    records, _ = split_records(path.read_bytes(), 0, True)
    events = [event for record in records for event in engine.feed(record)] + engine.flush()
    return [_event_key(event) for event in events]


def live_events(path: Path, rng: random.Random) -> tuple[list[tuple[object, ...]], str]:
    """The daemon's reading: the log as a writer's random-sized writes, records as a follower's
    ``RecordBuffer`` completes them, each read's batch given to an attempt's ``Matcher`` (the engine in
    its worker thread, batches cut at 16 KiB, time budgets), the prefilter as chosen."""
    prefilter = rng.random() < 0.7
    largest = rng.choice([64, 4096, 65_536, 1 << 20])
    data = path.read_bytes()
    sizes = []
    pos = 0
    while pos < len(data):
        sizes.append(rng.randint(1, largest))
        pos += sizes[-1]

    async def follow() -> list[ProbeEvent]:
        matcher = Matcher(load_packs(), 0, "fuzz")
        buffer = RecordBuffer(0)
        events: list[ProbeEvent] = []
        disabled = []
        try:
            pos = 0
            for size in sizes:
                matched = await matcher.feed(buffer.feed(data[pos:pos + size]))
                events += matched.events
                disabled += matched.disabled
                pos += size
            for matched in (await matcher.feed(buffer.flush()), await matcher.flush()):
                events += matched.events
                disabled += matched.disabled
        finally:
            matcher.close()
        if disabled:
            raise AssertionError(f"packs disabled: {disabled}")
        return events

    with _prefilter(on=prefilter):
        events = asyncio.run(follow())
    return [_event_key(event) for event in events], f"live, writes up to {largest} B, prefilter {'on' if prefilter else 'off'}"


def shortcut(path: Path, rng: random.Random) -> tuple[tuple[str, str], str]:
    chunk = rng.choice([97, 1013, 4096, 65_536, 1 << 20, 4 << 20])
    prefilter = rng.random() < 0.7
    skip = rng.random() < 0.8
    default, _replay._CHUNK = _replay._CHUNK, chunk
    try:
        with _prefilter(on=prefilter):
            report = _replay.replay_file(path, skip_quiet=skip)
    finally:
        _replay._CHUNK = default
    how = f"chunk {chunk}, prefilter {'on' if prefilter else 'off'}, quiet lines {'skipped' if skip else 'split'}"
    return (report.to_json(), report.render_text()), how


def campaign(args: tuple[int, float, str, bool]) -> tuple[int, list[str]]:
    seed, seconds, keep, live = args
    lines = corpus_lines()
    deadline = time.monotonic() + seconds
    cases, failures = 0, []
    work = Path(tempfile.mkdtemp(prefix=f"fuzz-reading-{seed}-"))
    while time.monotonic() < deadline:
        case_seed = seed * 1_000_003 + cases
        rng = random.Random(case_seed)
        path = work / "case.log"
        path.write_bytes(random_log(rng, lines))
        try:
            want = reference(path)
            tries: list[tuple[object, str]] = [shortcut(path, rng), shortcut(path, rng)]
            if live:
                tries.append(live_events(path, rng))
            found = next((f"({how}) differs from the reference" for got, how in tries
                          if got != (reference_events(path) if how.startswith("live") else want)), None)
        except Exception as exc:  # noqa: BLE001 - a reader that raises is a finding too
            found = f"raised {exc!r}"
        if found is not None:
            kept = Path(keep) / f"case-{case_seed}.log"
            kept.write_bytes(path.read_bytes())
            failures.append(f"case {case_seed} {found}: {kept}")
        cases += 1
    path.unlink(missing_ok=True)
    work.rmdir()
    return cases, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each worker runs (default 60)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    parser.add_argument("--seed", type=int, default=1, help="the first worker's seed (default 1)")
    parser.add_argument("--offline-only", action="store_true", help="skip the live reading's comparison")
    parser.add_argument("--keep", type=Path, help="where cases that differ are written (default: a temporary dir)")
    args = parser.parse_args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="fuzz-reading-cases-"))
    keep.mkdir(parents=True, exist_ok=True)
    jobs = [(args.seed + i, args.seconds, str(keep), not args.offline_only) for i in range(args.workers)]
    started = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(campaign, jobs)
    cases = sum(n for n, _ in results)
    failures = [line for _, found in results for line in found]
    print(f"{cases} random logs, each read by the reference, two offline shortcuts"
          f"{'' if args.offline_only else ' and the live reading'}, {args.workers} workers, "
          f"{time.monotonic() - started:.0f} s: {len(failures)} differ")
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
