"""The draft for a Llama-style target with rope scaling (YaRN) and a large target: the config copies the
target's rope settings, the frequencies match transformers' reference, and a draft for hidden size 7168
and a 163,840-token vocabulary builds with the right shapes (meta device). MLA targets (DeepSeek, Kimi),
whose draft does not copy the target's heads or scaling, are in test_train_draft_shape.py."""

from __future__ import annotations

import argparse
import json

import pytest
from train_helpers import THIRD_PARTY_WARNINGS

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import rope
from eagle3 import train as T
from eagle3.draft import DraftConfig, Eagle3Draft

# A Llama-style (not MLA) target of Kimi-K2's size and YaRN scaling (the values that matter here).
KIMI = {"model_type": "llama", "hidden_size": 7168, "vocab_size": 163840, "num_hidden_layers": 61,
        "num_attention_heads": 64, "num_key_value_heads": 64, "intermediate_size": 18432, "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"}}


def _draft_config(tc: dict) -> DraftConfig:
    meta = torch.device("meta")
    target = T.Target(embed=torch.empty(tc["vocab_size"], tc["hidden_size"], device=meta),
                      norm=torch.empty(tc["hidden_size"], device=meta),
                      lm_head=torch.empty(tc["vocab_size"], tc["hidden_size"], device=meta),
                      eps=1e-6, config=tc, path=None)
    ds = argparse.Namespace(hidden=tc["hidden_size"], layer_ids=[2, 30, 58, 61])
    args = argparse.Namespace(num_heads=None, num_kv_heads=None, intermediate_size=None)
    return T.draft_config(target, ds, 32000, args)


def test_a_kimi_sized_draft_builds_with_the_right_shapes_on_the_meta_device():
    cfg = _draft_config(KIMI)
    assert cfg.rope_scaling == {"rope_type": "yarn", "beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                                "original_max_position_embeddings": 4096}
    assert (cfg.max_position_embeddings, cfg.rope_theta, cfg.head_dim) == (131072, 50000.0, 112)
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    shapes = {k: tuple(v.shape) for k, v in draft.state_dict().items()}
    assert shapes == {
        "fc.weight": (7168, 3 * 7168),
        "midlayer.input_layernorm.weight": (7168,), "midlayer.hidden_norm.weight": (7168,),
        "midlayer.self_attn.q_proj.weight": (64 * 112, 2 * 7168),
        "midlayer.self_attn.k_proj.weight": (64 * 112, 2 * 7168),
        "midlayer.self_attn.v_proj.weight": (64 * 112, 2 * 7168),
        "midlayer.self_attn.o_proj.weight": (7168, 64 * 112),
        "midlayer.post_attention_layernorm.weight": (7168,),
        "midlayer.mlp.gate_proj.weight": (18432, 7168), "midlayer.mlp.up_proj.weight": (18432, 7168),
        "midlayer.mlp.down_proj.weight": (7168, 18432),
        "norm.weight": (7168,), "lm_head.weight": (32000, 7168), "d2t": (32000,), "t2d": (163840,),
    }
    assert all(v.is_meta for v in draft.state_dict().values())  # no memory was allocated


def test_the_exported_config_carries_the_rope_scaling_and_reads_back():
    cfg = _draft_config(KIMI)
    out = cfg.vllm_config()
    assert out["rope_scaling"]["rope_type"] == "yarn" and out["rope_scaling"]["factor"] == 32.0
    assert out["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 50000.0, "beta_fast": 1.0, "beta_slow": 1.0,
                                      "factor": 32.0, "original_max_position_embeddings": 4096}
    assert "mscale" not in out["rope_scaling"]  # vLLM's Llama YaRN ignores it; transformers would not
    back = DraftConfig.from_vllm_config(json.loads(json.dumps(out)))
    assert back == cfg


def test_plain_rope_keeps_the_old_fingerprint():
    tc = {k: v for k, v in KIMI.items() if k != "rope_scaling"}
    cfg = _draft_config(tc)
    assert cfg.rope_scaling is None and "rope_scaling" not in cfg.to_dict()
    assert cfg.vllm_config()["rope_scaling"] is None


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "linear", "factor": 2.0},
])
def test_frequencies_match_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta = 50000.0
    hf = LlamaConfig(hidden_size=1024, num_attention_heads=8, max_position_embeddings=131072,
                     rope_parameters={**scaling, "rope_theta": theta})
    want_inv, want_scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, torch.device("cpu"))
    got_inv, got_scale = rope.inv_freq_and_scale(128, theta, scaling)
    torch.testing.assert_close(got_inv, want_inv.float(), rtol=1e-5, atol=0)
    assert got_scale == pytest.approx(want_scale)


def test_an_unsupported_scaling_is_reported_and_falls_back_to_plain_rope():
    scaling, warning = rope.draft_scaling({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}})
    assert scaling is None and "'longrope' is not supported" in warning
