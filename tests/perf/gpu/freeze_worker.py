"""Freeze (SIGSTOP) a TP worker of a vLLM run once the shard bar reaches AT/N: a real stuck load.

    freeze_worker.py LOG AT [LIMIT_S] [RANK]
    FREEZE_PREFIX=EngineCore freeze_worker.py LOG AT     (TP=1: the engine process loads the weights)

Reads the attempt's log as it grows, learns the pid of `(Worker_TP<RANK> pid=N)` (rank 0 by default)
from its prefixes, and sends SIGSTOP to that pid when `Loading safetensors checkpoint shards: ... AT/N`
appears (rank 0 draws the bar).  Prints the pid and the time; exits.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

BAR_RE = re.compile(rb"checkpoint shards:\s+\d+% Completed \| (\d+)/(\d+)")


def main(log: str, at: int, rank: int = 0, limit_s: float = 600.0) -> int:
    prefix = os.environ.get("FREEZE_PREFIX", f"Worker_TP{rank}").encode()
    pid_re = re.compile(rb"\(" + re.escape(prefix) + rb" pid=(\d+)\)")
    deadline = time.monotonic() + limit_s
    while not os.path.exists(log):
        time.sleep(0.01)
    pid = None
    data = b""
    with open(log, "rb") as handle:
        while time.monotonic() < deadline:
            chunk = handle.read()
            if not chunk:
                time.sleep(0.005)
                continue
            data = (data + chunk)[-65536:]
            if pid is None and (m := pid_re.search(data)):
                pid = int(m.group(1))
            bars = [int(m.group(1)) for m in BAR_RE.finditer(chunk)]
            if pid is not None and bars and max(bars) >= at:
                os.kill(pid, signal.SIGSTOP)
                print(f"SIGSTOP {prefix.decode()} pid {pid} at shard {max(bars)} ({time.time():.3f})", flush=True)
                return 0
    print("never reached the shard to freeze at", flush=True)
    return 1


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], int(args[1]), int(args[3]) if len(args) > 3 else 0, float(args[2]) if len(args) > 2 else 600.0))
