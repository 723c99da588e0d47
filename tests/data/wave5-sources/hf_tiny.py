"""A tiny Llama built from a config (no download) trained with transformers' Trainer, run to make real
logs (see run_all.sh).

    python hf_tiny.py done      # 60 steps, then save_pretrained in 2 shards and a reload
    python hf_tiny.py oom       # a batch far past the card at the first step
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int, length: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 1000, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    mode = sys.argv[1]
    out = f"/tmp/hf-{mode}"
    size = (2048, 8, 2048) if mode == "oom" else (256, 4, 512)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=size[0], num_hidden_layers=size[1], num_attention_heads=8,
                      num_key_value_heads=8, intermediate_size=size[0] * 2, max_position_embeddings=size[2])
    model = LlamaForCausalLM(cfg)
    print(f"model: {model.num_parameters() / 1e6:.1f}M parameters", flush=True)
    batch = 512 if mode == "oom" else 16
    args = TrainingArguments(output_dir=out, max_steps=60, per_device_train_batch_size=batch, logging_steps=10,
                             save_steps=30, report_to=[], bf16=torch.cuda.is_available(), learning_rate=1e-3,
                             disable_tqdm=False)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(2048, size[2]))
    trainer.train()
    model.save_pretrained(f"{out}/final", max_shard_size="10MB")
    print(f"Saved model to {out}/final", flush=True)
    LlamaForCausalLM.from_pretrained(f"{out}/final")
    print("reload ok", flush=True)


if __name__ == "__main__":
    main()
