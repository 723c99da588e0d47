"""The draft's attention shape and rotary embedding, derived from the target's config.

Copied from the target, whatever its family (by :func:`eagle3.train.draft_config`): ``hidden_size`` (the
hidden states and the frozen embeddings have that width), ``intermediate_size``, ``vocab_size``,
``rms_norm_eps``, ``max_position_embeddings`` and ``rope_theta``.

Attention (this module):

* a Llama-style target (multi-head or grouped-query attention: Llama, Qwen, Mistral, ...): the draft's
  ``num_attention_heads``, ``num_key_value_heads`` and ``head_dim`` are the target's (``head_dim``
  defaulting to hidden / heads), and its rope scaling is copied (:func:`.rope.draft_scaling`);
* an MLA target (DeepSeek-V2/V3, Kimi-K2: ``kv_lora_rank``, ``qk_rope_head_dim`` and ``v_head_dim`` in its
  config, or model_type ``deepseek_v2``/``deepseek_v3``/``deepseek_v32``/``kimi_k2``/``kimi_k25``): its
  attention has no Llama shape to copy (queries and keys of ``qk_nope_head_dim + qk_rope_head_dim``, values
  of ``v_head_dim``, keys and values from one compressed latent, only the 64 rope dimensions rotated and
  YaRN-scaled), and copying ``num_attention_heads`` gives e.g. Kimi-K2's 64 heads of 7168/64 = 112 with 64
  KV heads. The draft (a Llama layer) gets the shape SpecForge's DeepSeek-V3 draft config uses:
  :data:`MLA_HEAD_DIM` = 128, hidden / 128 query heads, :data:`MLA_KV_HEADS` = 8 KV heads, and plain RoPE
  (the target's ``rope_theta``, no scaling). ``--num-heads``/``--num-kv-heads`` still override it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import rope

MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25")
MLA_HEAD_DIM = 128
MLA_KV_HEADS = 8


@dataclass(frozen=True)
class Shape:
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    note: str | None = None  # one line on what was chosen instead of the target's, or None
    warning: str | None = None


def is_mla(tc: dict[str, Any]) -> bool:
    """Whether the target's text config describes multi-head latent attention (DeepSeek-V2/V3 family)."""
    return all(tc.get(k) is not None for k in MLA_KEYS) or str(tc.get("model_type") or "") in MLA_TYPES


def rope_theta(tc: dict[str, Any]) -> float:
    params = tc.get("rope_parameters") or {}
    return float(params.get("rope_theta") or tc.get("rope_theta") or 10000.0)


def draft_shape(tc: dict[str, Any], hidden: int, num_heads: int | None = None,
                num_kv_heads: int | None = None) -> Shape:
    """The draft's heads, KV heads, head_dim and rotary settings for a target with text config ``tc``."""
    theta = rope_theta(tc)
    if is_mla(tc):
        nh = num_heads or max(1, hidden // MLA_HEAD_DIM)
        head_dim = MLA_HEAD_DIM if not num_heads else hidden // nh
        nkv = num_kv_heads or math.gcd(nh, MLA_KV_HEADS)
        note = (f"MLA target ({tc.get('model_type') or '?'}): draft attention {nh} heads x {head_dim}, {nkv} KV "
                f"heads, plain RoPE (theta {theta:g}) instead of the target's "
                f"{tc.get('num_attention_heads', '?')} MLA heads"
                + (f" and its {rope.scaling_type(tc.get('rope_scaling'))} rope scaling"
                   if rope.scaling_type(tc.get("rope_scaling")) != "default" else ""))
        return Shape(nh, nkv, head_dim, theta, None, note)
    nh = num_heads or int(tc.get("num_attention_heads") or max(1, hidden // 128))
    nkv = num_kv_heads or (int(tc.get("num_key_value_heads") or nh) if not num_heads else nh)
    head_dim = (int(tc.get("head_dim") or 0) if not num_heads else 0) or hidden // nh
    scaling, warning = rope.draft_scaling(tc)
    return Shape(nh, nkv, head_dim, theta, scaling, None, warning)
