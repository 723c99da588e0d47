"""Small real jobs whose logs widen the probe corpus (tests/data/corpus/device-logs/).

Each mode is a program that really runs torch / torchrun / transformers / Lightning on a GPU
and ends the way its name says; corpus_runs.sh starts them and keeps their logs.  Nothing
here prints a line for the probes' sake: what is logged is what the libraries log, plus the
plain prints a training script makes.

    python corpus_job.py MODE [--backend gloo|nccl]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm


def _init(backend: str, timeout_s: float = 60) -> tuple[int, int]:
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def _model(device: str) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(device)


def _train(model: torch.nn.Module, device: str, steps: int, rank: int, batch: int = 64, on_step=None) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in tqdm(range(steps), desc=f"train rank {rank}"):
        if on_step is not None:
            on_step(step)
        x = torch.randn(batch, 256, device=device)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.02)


def ddp(args: argparse.Namespace) -> None:
    rank, world = _init(args.backend, 15 if args.mode == "collective-timeout" else 60)
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % max(1, torch.cuda.device_count())}" \
        if args.backend == "nccl" else "cpu"
    if args.mode == "ddp-config-error" and rank == 1:
        raise ValueError(f"unsupported lr schedule 'cosine-warm' (world size {world})")
    model = torch.nn.parallel.DistributedDataParallel(_model(device))

    def on_step(step: int) -> None:
        if args.mode == "ddp-sigkill" and rank == 0 and step == 15:
            os.kill(os.getpid(), 9)
        if args.mode == "collective-timeout" and rank == 1 and step == 5:
            time.sleep(3600)  # stops joining the gradient all-reduce

    _train(model, device, 30, rank, on_step=on_step)
    dist.barrier()
    print(f"rank {rank}: training finished", flush=True)
    dist.destroy_process_group()


def store_timeout(args: argparse.Namespace) -> None:
    # One rank of two: the other never comes.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=10))


def oom(args: argparse.Namespace) -> None:
    model = _model("cuda")

    def grow(step: int) -> None:
        if step == 12:
            torch.empty((1 << 40,), dtype=torch.uint8, device="cuda")  # 1 TiB

    _train(model, "cuda", 30, 0, on_step=grow)


def device_assert(args: argparse.Namespace) -> None:
    emb = torch.nn.Embedding(1000, 64).cuda()
    for step in range(5):
        ids = torch.randint(0, 1000 if step < 3 else 5000, (32, 16), device="cuda")
        print(f"step {step} loss {emb(ids).pow(2).mean().item():.4f}", flush=True)


def fsdp(args: argparse.Namespace) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    rank, _ = _init("nccl")
    torch.cuda.set_device(0)
    model = FSDP(_model("cuda"))
    _train(model, "cuda", 30, rank)
    dist.destroy_process_group()


def hf_trainer(args: argparse.Namespace) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    heads = 6 if args.mode == "hf-config-error" else 4
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=heads)
    model = LlamaForCausalLM(config)
    model.config.head_dim = 128 // heads
    if args.mode == "hf-config-error" and 128 % heads:
        raise ValueError(f"hidden_size 128 is not a multiple of num_attention_heads {heads}")

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    batch = 1 << 16 if args.mode == "hf-trainer-oom" else 8
    targs = TrainingArguments(output_dir="/tmp/hf-out", per_device_train_batch_size=batch, per_device_eval_batch_size=8,
                              max_steps=40, eval_strategy="steps", eval_steps=15, logging_steps=10, save_strategy="no",
                              report_to=[], disable_tqdm=False)
    Trainer(model=model, args=targs, train_dataset=Data(), eval_dataset=Data()).train()


def lightning(args: argparse.Namespace) -> None:
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model("cpu")

        def setup(self, stage: str) -> None:
            assert args.mode != "lightning-assert", "expected 4 attention heads per KV group, got 3"

        def training_step(self, batch, _):
            (x,) = batch
            loss = (self.net(x) - x).pow(2).mean()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, _):
            (x,) = batch
            self.log("val_loss", (self.net(x) - x).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(512, 256))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    trainer = pl.Trainer(max_epochs=2, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False)
    trainer.fit(Module(), loader, loader)


def suicide(args: argparse.Namespace) -> None:
    _train(_model("cuda"), "cuda", 8, 0)
    os.kill(os.getpid(), 9)


MODES = {
    "ddp-ok": ddp, "ddp-config-error": ddp, "ddp-sigkill": ddp, "collective-timeout": ddp, "nccl-duplicate-gpu": ddp,
    "store-timeout": store_timeout, "oom": oom, "device-assert": device_assert, "fsdp": fsdp,
    "hf-trainer": hf_trainer, "hf-trainer-oom": hf_trainer, "hf-config-error": hf_trainer,
    "lightning": lightning, "lightning-assert": lightning, "suicide": suicide,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    MODES[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
