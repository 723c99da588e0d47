"""A job for the crash benchmark: a few lines of output, then an uncaught exception.

    _crasher.py NAME [--lines 5] [--interval 0.05]

The last line before the exception starts with the ``time.time()`` taken just before it is
written and raised; Python then prints the traceback to the same log and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time


def load_shard(name: str, index: int) -> None:
    raise RuntimeError(f"shard {index} of {name} is corrupt: header length mismatch")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--lines", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args()
    for i in range(args.lines):
        print(f"{time.time():.6f} worker 0: loading shard {i}", flush=True)
        time.sleep(args.interval)
    print(f"{time.time():.6f} worker 0: loading shard {args.lines}", flush=True)
    load_shard(args.name, args.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
