"""A job that replays a real log, record by record, with its recorded pacing compressed.

    replay.py LOG [--arrivals TSV] [--speed X] [--interval S] [--freeze-after N] [--collapse-gaps-over S] [--exit CODE]

With an arrivals TSV (seconds-since-launch, then the record as a Python literal) the
records come at their real times divided by --speed; otherwise the log's lines come every
--interval seconds.  --freeze-after N stops writing after N records and hangs (a stuck
load); --collapse-gaps-over S removes pauses longer than S real seconds (a healthy run of
a log that had a freeze).  Writes raw bytes, unbuffered, as the real program did.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time


def records_from_tsv(path: str) -> list[tuple[float, str]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            stamp, _, literal = line.rstrip("\n").partition("\t")
            if literal.startswith("#"):
                continue
            out.append((float(stamp), ast.literal_eval(literal)))
    return out


def records_from_log(path: str, interval: float) -> list[tuple[float, str]]:
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read()
    return [(i * interval, line) for i, line in enumerate(text.splitlines(keepends=True))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--arrivals")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=0.002)
    parser.add_argument("--freeze-after", type=int, default=None)
    parser.add_argument("--collapse-gaps-over", type=float, default=None)
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    records = records_from_tsv(args.arrivals) if args.arrivals else records_from_log(args.log, args.interval)
    out = sys.stdout.buffer
    start = time.monotonic()
    shift = 0.0
    previous = records[0][0] if records else 0.0
    for index, (stamp, text) in enumerate(records):
        if args.freeze_after is not None and index >= args.freeze_after:
            while True:
                time.sleep(3600)
        gap = stamp - previous
        if args.collapse_gaps_over is not None and gap > args.collapse_gaps_over:
            shift += gap - 0.1
        previous = stamp
        due = start + (stamp - records[0][0] - shift) / args.speed
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        out.write(text.encode("utf-8", errors="surrogateescape"))
        out.flush()
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
