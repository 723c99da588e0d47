"""A DeepSpeed pipeline-parallel job (PipelineModule over two stages) on the CPU accelerator, run here
to make corpus logs; DeepSpeed prints its own `steps: N loss: X` lines.

    deepspeed --num_gpus 2 ds_pipe.py                  # 40 steps, done
    deepspeed --num_gpus 2 ds_pipe.py --bad-record 200  # record 200 is one feature short (step 13)
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule
from torch import nn


class Data(torch.utils.data.Dataset):
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(31 if i == self.bad else 32, generator=torch.Generator().manual_seed(i))
        return x, x.sum(dim=0, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--bad-record", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    layers = [LayerSpec(nn.Linear, 32, 64), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 64, 64), LayerSpec(nn.ReLU),
              LayerSpec(nn.Linear, 64, 64), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 64, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.MSELoss(), partition_method="uniform")
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 5}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                           training_data=Data(args.bad_record))
    for _ in range(args.steps):
        engine.train_batch()


if __name__ == "__main__":
    main()
