"""What a small read costs the daemon to match: through the attempt's worker thread and back, or on the loop.

    .venv/bin/python tests/perf/bench_handoff.py [--reads 3000] [--lines 2]

One ``Matcher`` (jobs/matching.py) with the benchmarks' packs is fed reads of ``--lines`` worker lines each, as a
busy log is read (§26: one to seven lines a read), after 128 KiB fed to measure its cost; the process's CPU time per
read is taken with every read matched on the loop (the matcher's own choice for such reads), then with every read
through the worker (the matcher told to stop matching on the loop), in the same run.  Prints both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PACKS, machine_note, table

from supervisor.core.events import Record
from supervisor.jobs import matching
from supervisor.probes import load_packs


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(reads: int, lines: int) -> tuple[float, float]:
    matcher = matching.Matcher(load_packs(PACKS), 0, "bench")
    offset = 0

    def read() -> list[Record]:
        nonlocal offset
        out = []
        for _ in range(lines):
            text = f"{time.time():.6f} worker 3: processed batch 1 of 2 (4096 tokens)"
            out.append(Record(text, offset, offset + len(text) + 1))
            offset += len(text) + 1
        return out

    try:
        while offset < 2 * matching._INLINE_AFTER_BYTES:  # measured, as an attempt's first reads are
            await matcher.feed(read())
        started = _cpu()
        for _ in range(reads):
            await matcher.feed(read())
        on_loop = (_cpu() - started) / reads
        matcher._inline_off = True
        started = _cpu()
        for _ in range(reads):
            await matcher.feed(read())
        through_worker = (_cpu() - started) / reads
        return on_loop, through_worker
    finally:
        matcher.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reads", type=int, default=3000)
    parser.add_argument("--lines", type=int, default=2, help="lines a read (default 2)")
    args = parser.parse_args()
    print(machine_note())
    on_loop, through_worker = asyncio.run(_run(args.reads, args.lines))
    print()
    print(table(["read of", "on the loop, CPU us a read", "through the worker, CPU us a read", "worker / loop"],
                [[f"{args.lines} lines", f"{on_loop * 1e6:.1f}", f"{through_worker * 1e6:.1f}",
                  f"{through_worker / on_loop:.1f}x"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
