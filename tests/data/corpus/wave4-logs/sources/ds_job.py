"""A tiny DeepSpeed job on the CPU accelerator, run here to make corpus logs.

    deepspeed --num_gpus 2 ds_job.py --ds-config batch-mismatch   # train_batch_size that cannot be split
    deepspeed --num_gpus 2 ds_job.py --ds-config ok               # ZeRO-1, 20 steps
    deepspeed --num_gpus 2 ds_job.py --ds-config ok --fail-at 12  # rank 1 meets a bad record at step 12
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from torch import nn

CONFIGS = {
    "ok": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": 1}, "steps_per_print": 5},
    "batch-mismatch": {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
                       "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
                       "zero_optimization": {"stage": 1}},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ds-config", default="ok")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=0)
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=CONFIGS[args.ds_config])
    for step in range(1, 21):
        if engine.global_rank == 1 and step == args.fail_at:
            raise ValueError(f"record {step * 8}: expected 32 features, got 31")
        x = torch.randn(8, 32)
        loss = nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
        if engine.global_rank == 0 and step % 5 == 0:
            print(f"step {step}/20 loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
