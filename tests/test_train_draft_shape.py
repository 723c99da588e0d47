"""The draft's shape for MLA targets (DeepSeek-V3, Kimi-K2): 8 KV heads x 128 and plain RoPE, as SpecForge's
DeepSeek-V3 draft config has, instead of copying the target's MLA heads and YaRN scaling."""

from __future__ import annotations

import argparse

import pytest
from train_helpers import THIRD_PARTY_WARNINGS

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import draft_shape
from eagle3 import train as T
from eagle3.draft import Eagle3Draft

# From https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (the keys that matter here;
# its MoE, quantisation and auto_map keys left out).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "vocab_size": 129280, "tie_word_embeddings": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}
# From https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json (the same keys).
KIMI_K2 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
    "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
    "rope_theta": 50000.0, "vocab_size": 163840, "tie_word_embeddings": False,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}


def _draft_config(tc: dict, capsys=None, **flags):
    meta = torch.device("meta")
    target = T.Target(embed=torch.empty(tc["vocab_size"], tc["hidden_size"], device=meta),
                      norm=torch.empty(tc["hidden_size"], device=meta),
                      lm_head=torch.empty(tc["vocab_size"], tc["hidden_size"], device=meta),
                      eps=1e-6, config=tc, path=None)
    ds = argparse.Namespace(hidden=tc["hidden_size"], layer_ids=[2, 30, 58, 61])
    args = argparse.Namespace(num_heads=None, num_kv_heads=None, intermediate_size=None)
    vars(args).update(flags)
    return T.draft_config(target, ds, 32000, args)


@pytest.mark.parametrize("tc", [DEEPSEEK_V3, KIMI_K2], ids=["deepseek_v3", "kimi_k2"])
def test_an_mla_target_gets_8_kv_heads_of_128_and_plain_rope(tc, capsys):
    cfg = _draft_config(tc)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (56, 8, 128)
    assert cfg.rope_scaling is None and cfg.rope_theta == float(tc["rope_theta"])
    # Copied: width, MLP width, vocabulary, positions.
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (
        7168, 18432, tc["vocab_size"], tc["max_position_embeddings"])
    out = cfg.vllm_config()
    assert out["rope_scaling"] is None and out["rope_parameters"] == {"rope_type": "default",
                                                                      "rope_theta": float(tc["rope_theta"])}
    assert (out["num_attention_heads"], out["num_key_value_heads"], out["head_dim"]) == (56, 8, 128)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("train note: ")]
    assert line == [f"train note: MLA target ({tc['model_type']}): draft attention 56 heads x 128, 8 KV heads, "
                    f"plain RoPE (theta {float(tc['rope_theta']):g}) instead of the target's "
                    f"{tc['num_attention_heads']} MLA heads and its yarn rope scaling"]


def test_a_kimi_k2_draft_builds_with_those_shapes_on_the_meta_device():
    cfg = _draft_config(KIMI_K2)
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    shapes = {k: tuple(v.shape) for k, v in draft.state_dict().items() if "self_attn" in k}
    assert shapes == {
        "midlayer.self_attn.q_proj.weight": (56 * 128, 2 * 7168),
        "midlayer.self_attn.k_proj.weight": (8 * 128, 2 * 7168),
        "midlayer.self_attn.v_proj.weight": (8 * 128, 2 * 7168),
        "midlayer.self_attn.o_proj.weight": (7168, 56 * 128),
    }


def test_flags_still_override_and_detection_needs_mla_keys_or_the_family():
    cfg = _draft_config(KIMI_K2, num_heads=64, num_kv_heads=4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 4, 112)
    assert _draft_config(DEEPSEEK_V3, num_heads=28).num_key_value_heads == 4  # gcd(28, 8): divides the heads
    # model_type alone, or the MLA keys alone (a renamed architecture), are enough.
    assert draft_shape.is_mla({"model_type": "deepseek_v2"})
    assert draft_shape.is_mla({"model_type": "my_mla", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128})
    assert not draft_shape.is_mla({"model_type": "llama", "num_attention_heads": 32})
    # A small MLA target (hidden 256): 2 heads x 128, 2 KV heads.
    small = draft_shape.draft_shape({"model_type": "deepseek_v2", "hidden_size": 256, "num_attention_heads": 16}, 256)
    assert (small.num_attention_heads, small.num_key_value_heads, small.head_dim) == (2, 2, 128)
    assert small.rope_scaling is None
