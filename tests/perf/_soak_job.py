"""A job for the soak benchmark: one long tqdm bar redrawn at full speed, with worker lines.

    _soak_job.py REDRAWS [--worker-every K] [--metric-every M] [--rate R]

Writes REDRAWS redraws of one bar (``\\r``-separated, as tqdm writes to a file), a plain worker
line (no probe reads it) every K redraws, and every M redraws a transformers loss line whose
loss is its sequence number (so the benchmark can count metric events lost or doubled).
Flushes every 64 lines; ``--rate``: redraws per second (0: full speed, as fast as it can).
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("redraws", type=int)
    parser.add_argument("--worker-every", type=int, default=4)
    parser.add_argument("--metric-every", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=0.0)
    args = parser.parse_args()
    start = time.monotonic()
    out = sys.stdout
    total = args.redraws
    seq = 0
    print("Running extraction", flush=True)
    for i in range(total + 1):
        out.write(f"\rExtracting: {100 * i // total:3d}%|####      | {i}/{total} [01:02<01:10, 8734.12it/s]")
        if i % args.worker_every == 0:
            out.write(f"\n[worker {i % 7}] shard {i // 1000} wrote batch {i} (4096 samples, 12.3 MB)\n")
        if i and i % args.metric_every == 0:
            seq += 1
            out.write(f"\n{{'loss': {seq}.0, 'learning_rate': 1e-05, 'epoch': 0.1}}\n")
        if i % 64 == 0:
            out.flush()
            if args.rate > 0:  # paced: each 64 redraws at their time
                time.sleep(max(0.0, start + i / args.rate - time.monotonic()))
    out.write(f"\nmetrics written: {seq}\nall good\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
