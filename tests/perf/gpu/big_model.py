# Copied from the project's GPU notes: writes a random-init 6.7B Llama as 13 shards (no download).
"""A ~6.7B-parameter random-init Llama written as ~1 GB safetensors shards (no download)."""
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

path = sys.argv[1]
if os.path.exists(os.path.join(path, "config.json")):
    sys.exit(0)
t = time.time()
cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
torch.manual_seed(0)
with torch.device("cuda"):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(path, max_shard_size="1GB")
print("wrote", len([f for f in os.listdir(path) if f.endswith(".safetensors")]), "shards in", round(time.time() - t, 1), "s", flush=True)
