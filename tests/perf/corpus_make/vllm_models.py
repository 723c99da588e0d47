"""Tiny random-init checkpoints for vLLM corpus runs (no download): a Llama in 4 shards and a
DeepSeek-V2 (MLA attention + MoE experts) in several shards.

    python3 vllm_models.py ROOT
"""
import os
import sys

import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
root = sys.argv[1]
llama = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                    num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, torch_dtype="bfloat16")
LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(f"{root}/tiny-llama", max_shard_size="60MB")
deepseek = DeepseekV2Config(
    hidden_size=1024, intermediate_size=2816, moe_intermediate_size=512, num_hidden_layers=6, num_attention_heads=16,
    num_key_value_heads=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
    kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, vocab_size=32000,
    max_position_embeddings=4096, topk_method="greedy", n_group=1, topk_group=1, torch_dtype="bfloat16")
DeepseekV2ForCausalLM(deepseek).to(torch.bfloat16).save_pretrained(f"{root}/tiny-deepseek", max_shard_size="60MB")
for name in ("tiny-llama", "tiny-deepseek"):
    print(name, sorted(os.listdir(f"{root}/{name}")), flush=True)
