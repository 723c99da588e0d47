"""A job for the crash benchmark: a few lines of output, then an uncaught exception.

    _crasher.py NAME [--lines 5] [--interval 0.05] [--exit-stamp FILE]

The last line before the exception starts with the ``time.time()`` taken just before it is
written and raised; Python then prints the traceback to the same log and exits 1.  With
``--exit-stamp``, an atexit handler (run after the traceback is printed, as the interpreter
shuts down) writes ``time.time()`` to FILE: the job's own last action before it exits.
"""

from __future__ import annotations

import argparse
import atexit
import sys
import time


def write_stamp(path: str) -> None:
    with open(path, "w") as handle:
        handle.write(f"{time.time():.6f}\n")


def load_shard(name: str, index: int) -> None:
    raise RuntimeError(f"shard {index} of {name} is corrupt: header length mismatch")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--lines", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--exit-stamp")
    args = parser.parse_args()
    if args.exit_stamp:
        atexit.register(write_stamp, args.exit_stamp)
    for i in range(args.lines):
        print(f"{time.time():.6f} worker 0: loading shard {i}", flush=True)
        time.sleep(args.interval)
    print(f"{time.time():.6f} worker 0: loading shard {args.lines}", flush=True)
    load_shard(args.name, args.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
