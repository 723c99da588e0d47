"""Data-parallel training across processes launched by ``torchrun`` (one per GPU; gloo on the CPU).

Without torchrun's environment (``WORLD_SIZE`` unset or 1) every helper is a no-op, so a plain
``python -m eagle3.train`` runs as one process exactly as before.

The draft's training-time test calls several of its methods per step, which DDP's forward hook
would not see; so gradients are summed explicitly after ``backward`` (:func:`sum_grads`, in flat
buckets) rather than through ``DistributedDataParallel``. Each rank scales its loss so that the sum
over ranks is the loss of the whole global batch (see ``train.py``), which makes the update equal
to a one-process step on the same global batch, up to floating-point summation order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

BUCKET_ELEMENTS = 1 << 25  # 128 MiB of fp32 gradients per all-reduce


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def from_env() -> World:
    """The process's place as torchrun describes it (rank 0 of 1 without torchrun)."""
    return World(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                 int(os.environ.get("LOCAL_RANK", "0")))


def say_once(line: str) -> None:
    """Print on rank 0 only (the other ranks' copies would be noise in the job's log)."""
    if from_env().main:
        print(line, flush=True)


def start(world: World, device: torch.device) -> None:
    if not world.distributed:
        return
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=world.rank, world_size=world.size,
                            device_id=device if device.type == "cuda" else None)


def barrier(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def stop(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            # Every rank past its last collective before any tears the group down: a rank that
            # destroys it while a peer is still in one aborted at exit ("terminate called without an
            # active exception", SIGABRT) on a loaded 2-core machine.
            dist.barrier()
            dist.destroy_process_group()


def all_sum(t: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast(obj: Any, world: World) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not world.distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_grads(params: Sequence[torch.nn.Parameter], world: World) -> None:
    """Sum every parameter's gradient over the ranks, in flat buckets."""
    if not world.distributed:
        return
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    start_i = 0
    while start_i < len(grads):
        end, n = start_i, 0
        while end < len(grads) and (n == 0 or n + grads[end].numel() <= BUCKET_ELEMENTS):
            n += grads[end].numel()
            end += 1
        chunk = grads[start_i:end]
        flat = torch.cat([g.reshape(-1) for g in chunk])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in chunk:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        start_i = end
    for p, g in zip(params, grads, strict=True):
        if p.grad is None:
            p.grad = g
