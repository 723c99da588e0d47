"""A GPU job that fails the way real ones do, for the supervise-crash-clean-relaunch loop on a real GPU.

    gpu_hog.py GIB [--orphan GIB] [--fail-after S]

Allocates GIB GiB with torch and prints it; with --orphan, first forks a worker that starts
its own session (so it leaves the job's process group and, once the parent dies, is
re-parented to init, as vLLM's EngineCore is after its API server is SIGKILLed) and holds
GIB GiB of its own; then raises the same RuntimeError every time (a deterministic bug).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def hold(gib: float, label: str) -> object:
    import torch

    block = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    print(f"{label} pid {os.getpid()} holds {gib:.1f} GiB", flush=True)
    return block


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gib", type=float)
    ap.add_argument("--orphan", type=float, default=0.0)
    ap.add_argument("--fail-after", type=float, default=2.0)
    args = ap.parse_args()
    if args.orphan and os.fork() == 0:
        os.setsid()
        block = hold(args.orphan, "orphan worker")
        while True:  # a worker that never notices its parent is gone
            time.sleep(1)
        del block
    block = hold(args.gib, "main")
    time.sleep(args.fail_after)
    raise RuntimeError(f"CUDA kernel launch failed on purpose after holding {args.gib} GiB")


if __name__ == "__main__":
    sys.exit(main())
