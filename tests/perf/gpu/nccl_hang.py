"""A real hang of the surviving rank: two NCCL ranks (one per GPU) doing all-reduce steps; rank 1
raises at step STEPS_BEFORE_BUG, rank 0 then waits in the next collective (NCCL gives up only after
its process-group timeout, 10 minutes by default).

    nccl_hang.py            the launcher: starts both ranks and waits for them, like mpirun
    nccl_hang.py RANK       one rank

Run it under supervise with `[health] hang_after_failure_s` set: the traceback of rank 1 followed by
silence, with the launcher still waiting on rank 0, is what the supervisor must judge and clean up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

WORLD = 2
STEPS_BEFORE_BUG = 5
PORT = os.environ.get("HANG_PORT", "29517")


def launcher() -> int:
    ranks = [subprocess.Popen([sys.executable, __file__, str(rank)]) for rank in range(WORLD)]
    codes = [rank.wait() for rank in ranks]
    print(f"launcher: ranks exited {codes}", flush=True)
    return max(codes)


def rank_main(rank: int) -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    # Hold memory the way a model shard would, so that NVML sees what a hang keeps.
    weights = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    grad = torch.ones(2**20, device="cuda")
    for step in range(1, 10_000):
        if rank == 1 and step == STEPS_BEFORE_BUG:
            raise RuntimeError(f"rank {rank}: bad batch at step {step}")
        dist.all_reduce(grad)
        torch.cuda.synchronize()
        print(f"[rank{rank}] step {step} grad {grad[0].item():.0f} weights {weights.numel() >> 30} GiB", flush=True)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(int(sys.argv[1])) if len(sys.argv) > 1 else launcher())
