"""Small real jobs on CPU whose logs widen the probe corpus (tests/data/corpus/cpu-logs/).

Each mode runs torch / torchrun / accelerate / TRL / transformers for real and ends the way its
name says; cpu_runs.sh starts them and keeps their logs.  Nothing is printed for the probes'
sake: what is logged is what the libraries log, plus the plain prints a training script makes.

    python cpu_job.py MODE
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

WORDS = "the a model learns to read logs and find where each job failed or finished".split()


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def tiny_llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))


def texts(n: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(12)) for i in range(n)]


def sft(mode: str) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tokenizer()
    column = "content" if mode == "sft-bad-column" else "text"
    data = Dataset.from_dict({column: texts(64)})
    args = SFTConfig(output_dir="/tmp/cpu-corpus/sft", max_steps=24, per_device_train_batch_size=4, logging_steps=4,
                     save_strategy="no", report_to=[], use_cpu=True, max_length=32, disable_tqdm=False)
    trainer = SFTTrainer(model=tiny_llama(len(tok)), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    print("sft finished", flush=True)


def accel(mode: str) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.randn(512, 64), batch_size=16)
    model, opt, data = acc.prepare(model, opt, data)
    for epoch in range(2):
        for step, x in enumerate(tqdm(data, desc=f"epoch {epoch}", disable=not acc.is_local_main_process)):
            loss = (model(x) - x).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if step % 8 == 0:
                acc.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            time.sleep(0.01)
    acc.print("training done")


def fsdp(mode: str) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in tqdm(range(20), desc=f"fsdp rank {rank}"):
        x = torch.randn(32, 64)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 5 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


def restart_fail(mode: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, attempt = dist.get_rank(), os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    print(f"rank {rank} attempt {attempt}: loading shard index", flush=True)
    if rank == 1:
        raise RuntimeError(f"shard index /tmp/cpu-corpus/data/index.json lists 12 shards, found 11 (attempt {attempt})")
    dist.barrier()


def host_oom(mode: str) -> None:
    model = torch.nn.Linear(256, 256)
    buffers = []
    for step in tqdm(range(20), desc="replay buffer"):
        model(torch.randn(8, 256)).sum().backward()
        if step == 6:
            buffers.append(torch.empty((1 << 44,), dtype=torch.uint8))  # 16 TiB of host memory
        time.sleep(0.02)


def disk_full(mode: str) -> None:
    # cpu_runs.sh mounts a 1 MiB tmpfs on CKPT_DIR: the first checkpoint (about 0.5 MiB) fits, the second does not.
    ckpt = os.environ.get("CKPT_DIR", "/tmp/cpu-corpus/ckpt")
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in tqdm(range(30), desc="train"):
        loss = model(torch.randn(16, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}; saving checkpoint", flush=True)
            torch.save({"model": model.state_dict(), "step": step}, f"{ckpt}/step-{step}.pt")
        time.sleep(0.02)


def trainer_disk_full(mode: str) -> None:
    # The Trainer's first checkpoint (model.safetensors, about 2 MiB) goes to CKPT_DIR, a 1 MiB tmpfs.
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    ids = torch.randint(0, 4096, (128, 32))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(output_dir=os.environ.get("CKPT_DIR", "/tmp/cpu-corpus/ckpt"), max_steps=30,
                             per_device_train_batch_size=8, logging_steps=5, save_steps=10, report_to=[],
                             use_cpu=True, disable_tqdm=False)
    Trainer(model=model, args=args, train_dataset=data).train()


def zero(mode: str) -> None:
    import deepspeed

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 5,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 2}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(20):
        x = torch.randn(8, 64)
        loss = (engine(x) - x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        time.sleep(0.02)
    print(f"rank {engine.global_rank} done", flush=True)


class Samples(torch.utils.data.Dataset):
    """Token-id samples from records; record 200 is broken the way MODE says (or none is)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.records = [{"ids": [(i * 7 + j) % 500 for j in range(16)]} for i in range(256)]
        if mode == "dataloader-keyerror":
            self.records[200] = {"input_ids": self.records[200]["ids"]}

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        if self.mode == "collate-typeerror" and i == 200:
            return None  # a filter that drops a bad record by returning None
        return torch.tensor(self.records[i]["ids"])


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 500)

    def forwad(self, x):  # misspelt: nn.Module finds no forward
        return self.proj(x)


def loop_error(mode: str) -> None:
    """A small LM training loop over a DataLoader that fails mid-run the way MODE says."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(500, 64)
    head = Head() if mode == "missing-forward" else torch.nn.Linear(64, 500)
    model = torch.nn.Sequential(emb, head)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(mode), batch_size=8, num_workers=1 if "dataloader" in mode else 0)
    for step, ids in enumerate(tqdm(loader, desc="train")):
        logits = model(ids[:, :-1])
        labels = ids[:, 1:]
        if mode == "batch-size-valueerror" and step == 20:
            labels = labels[:-1]  # a last-batch bug: one row short
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 500), labels.reshape(-1)) \
            if mode != "batch-size-valueerror" or step != 20 else \
            torch.nn.functional.cross_entropy(logits[:, -1], labels[:, -1])
        if mode == "nan-assert" and step == 17:
            loss = loss * float("inf") * 0
        assert torch.isfinite(loss), f"loss is {loss.item()} at step {step}"
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if mode == "attribute-error" and step == 15:
            torch.save(model.module.state_dict(), "/tmp/cpu-corpus/step-15.pt")  # as if wrapped in DDP
        time.sleep(0.02)


def rendezvous(mode: str) -> None:
    print("never reached: the rendezvous should not complete", flush=True)


MODES = {"sft": sft, "sft-bad-column": sft, "accelerate": accel, "fsdp": fsdp, "restart-fail": restart_fail,
         "host-oom": host_oom, "disk-full": disk_full, "rendezvous": rendezvous, "deepspeed": zero, "trainer-disk-full": trainer_disk_full,
         **{m: loop_error for m in ("dataloader-keyerror", "collate-typeerror", "batch-size-valueerror", "nan-assert",
                                    "missing-forward", "attribute-error")}}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[1])
