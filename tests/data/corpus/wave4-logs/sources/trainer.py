"""Tiny CPU training jobs that print their own `step N/M loss X` lines, run here to make corpus logs.

    python trainer.py plain                 # one process, 60 steps, done
    python trainer.py shape-error           # one process, a batch of the wrong width at step 23
    python trainer.py long                  # one process, 3000 steps (about 4 minutes)
    torchrun --nproc_per_node 2 --max-restarts 2 trainer.py elastic-once   # rank 1 fails once, the restart finishes
    torchrun --nproc_per_node 2 --max-restarts 1 trainer.py elastic-always # rank 1 fails at step 6 on every attempt
    torchrun --nproc_per_node 2 --max-restarts 1 trainer.py elastic-sigkill-once  # rank 0 SIGKILLed at step 6, once
    torchrun --nproc_per_node 2 trainer.py pipeline          # GPipe over 2 stages (gloo), 30 steps
    torchrun --nproc_per_node 2 trainer.py pipeline-shapes   # the same, each stage given its shapes
    torchrun --nproc_per_node 2 trainer.py pipeline-mismatch # stage 1 built for the wrong width
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def log(msg: str) -> None:
    print(msg, flush=True)


def data(step: int, width: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, width, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def plain(total: int = 60, bad_step: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    log(f"model: {sum(p.numel() for p in model.parameters())} parameters; training for {total} steps")
    t0 = time.time()
    for step in range(1, total + 1):
        x, y = data(step, 31 if step == bad_step else 32)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % (5 if total < 1000 else 50) == 0 or step == 1:
            log(f"step {step}/{total} loss {loss.item():.4f} lr 1.0e-02 ({(time.time() - t0) / step * 1000:.1f} ms/step)")
        time.sleep(0.05)
    torch.save(model.state_dict(), "/tmp/trainer-plain.pt")
    log(f"training finished: {total} steps, final loss {loss.item():.4f}, saved /tmp/trainer-plain.pt")


def elastic(always: bool, sigkill: bool = False) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log(f"[rank {rank}] process group up: world {world}, restart {restart}")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    total = 20
    for step in range(1, total + 1):
        if sigkill and rank == 0 and step == 6 and restart == 0:
            os.kill(os.getpid(), 9)  # as the kernel's OOM killer or a hand's kill -9 would
        if not sigkill and rank == 1 and step == 6 and (always or restart == 0):
            raise RuntimeError(f"data shard /data/shard-{rank:03d}.bin: unexpected end of file at record {step * 16}")
        x, y = data(step * world + rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            log(f"step {step}/{total} loss {loss.item():.4f}")
        time.sleep(0.1)
    if rank == 0:
        log(f"done: {total} steps")
    dist.destroy_process_group()


def pipeline(mismatch: bool, shapes: bool = False) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    if rank == 0:
        part = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
    else:
        part = nn.Sequential(nn.Linear(48 if mismatch else 64, 64), nn.ReLU(), nn.Linear(64, 1))
    # pipeline-shapes: the stage is told its microbatch shapes, so no shape inference runs
    # (plain "pipeline" infers them on the first step).
    io = {"input_args": torch.empty(4, 32 if rank == 0 else 64), "output_args": torch.empty(4, 64 if rank == 0 else 1)}
    stage = PipelineStage(part, rank, world, torch.device("cpu"), **(io if shapes else {}))
    loss_fn = lambda out, target: nn.functional.mse_loss(out, target)  # noqa: E731
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn if rank == world - 1 else None)
    opt = torch.optim.SGD(part.parameters(), lr=1e-2)
    log(f"[rank {rank}] pipeline stage {rank} of {world}: {sum(p.numel() for p in part.parameters())} parameters")
    total = 30
    for step in range(1, total + 1):
        x, y = data(step)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            if step % 5 == 0 or step == 1:
                log(f"step {step}/{total} loss {torch.stack(losses).mean().item():.4f}")
        opt.step()
    log(f"[rank {rank}] done")
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "plain":
        plain()
    elif mode == "long":
        plain(total=3000)
    elif mode == "shape-error":
        plain(bad_step=23)
    elif mode in ("elastic-once", "elastic-always", "elastic-sigkill-once"):
        elastic(mode == "elastic-always", sigkill=mode == "elastic-sigkill-once")
    elif mode in ("pipeline", "pipeline-mismatch", "pipeline-shapes"):
        pipeline(mode == "pipeline-mismatch", shapes=mode == "pipeline-shapes")
    else:
        raise SystemExit(f"unknown mode {mode}")
