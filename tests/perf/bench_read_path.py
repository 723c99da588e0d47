"""CPU per followed line of the daemon's reading path alone, in one process, for the cost target.

    .venv/bin/python tests/perf/bench_read_path.py [--lines 200000] [--batch 20]

The daemon's cost per line (bench_scale.py) is the reading path (inotify events, records,
the probe engine) plus the runner's work per batch and per event (watchdog, store, bus).  On
a shared machine bench_scale's figures move with the load (its batching depends on timing);
this bench times the reading path's part deterministically, on the load of the cost target:
tests/perf/_writer.py's lines (a transformers shard bar every 10th line, the others worker lines
no probe matches), read in batches of ``--batch`` lines (what a busy follower reads every 20 ms
at 1000 lines/s), each batch also bringing one inotify event per line from 8 logs written in turn.

Prints CPU microseconds per line, per stage and in all, beside the target (5 us a line for the
whole daemon).
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.core.records import RecordBuffer
from supervisor.hosts._inotify import IN_MODIFY, parse_events
from supervisor.probes import ProbeEngine, load_packs

TARGET_US = 5.0


def writer_lines(n: int, every: int = 10) -> list[bytes]:
    bars = n // every
    out = []
    for i in range(n):
        if (i + 1) % every == 0:
            done = (i + 1) // every
            pct = 100 * done // bars
            text = f"Loading checkpoint shards: {pct:3d}%|{'#' * (pct // 10):<10}| {done}/{bars} [00:05<00:05,  1.00s/it]"
        else:
            text = f"worker 3: processed batch {i} of {n} (4096 tokens)"
        out.append(f"{1733000000 + i / 1000:.6f} {text}\n".encode())
    return out


def inotify_buffer(lines: int, logs: int = 8) -> bytes:
    """One IN_MODIFY per write, the logs written in turn (the kernel merges none of them)."""
    return b"".join(struct.pack("iIII", 1 + i % logs, IN_MODIFY, 0, 0) for i in range(lines))


def read_events(buf: bytes) -> int:
    """What the hub does with one read of the inotify descriptor (supervisor.hosts._inotify)."""
    reader = getattr(sys.modules["supervisor.hosts._inotify"], "_parse_raw", None)
    if reader is None:  # before: every event parsed into an object and dispatched
        return len(parse_events(buf))
    return len(dict.fromkeys(reader(buf)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    lines = writer_lines(args.lines)
    chunks = [b"".join(lines[i:i + args.batch]) for i in range(0, len(lines), args.batch)]
    events_buf = inotify_buffer(args.batch)
    buffer, engine = RecordBuffer(), ProbeEngine(load_packs())
    spent = {"inotify events": 0.0, "records (split)": 0.0, "probe engine": 0.0}
    events = 0
    for chunk in chunks:
        t0 = time.thread_time()
        read_events(events_buf)
        t1 = time.thread_time()
        records = buffer.feed(chunk)
        t2 = time.thread_time()
        events += len(engine.feed_many(records))
        t3 = time.thread_time()
        spent["inotify events"] += t1 - t0
        spent["records (split)"] += t2 - t1
        spent["probe engine"] += t3 - t2
    total = sum(spent.values())
    print(f"{args.lines} lines in batches of {args.batch}, {events} events (every 10th line a progress bar)\n")
    print("| stage | CPU us per line |\n|---|---:|")
    for stage, seconds in spent.items():
        print(f"| {stage} | {seconds / args.lines * 1e6:.2f} |")
    per_line = total / args.lines * 1e6
    print(f"| reading path in all | {per_line:.2f} |")
    print(f"\nthe daemon's target: <= {TARGET_US:.0f} us a line in all; the reading path alone takes {per_line:.2f} us "
          f"({100 * per_line / TARGET_US:.0f}% of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
