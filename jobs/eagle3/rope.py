"""Rotary frequencies of the draft: plain RoPE or the target's scaling (linear, llama3, YaRN).

A draft for a Llama-style target copies the target's ``rope_scaling`` into its own config (the draft
of an MLA target, DeepSeek or Kimi, whose configs carry YaRN, gets plain RoPE: :mod:`.draft_shape`),
and is trained with the same frequencies that vLLM's Llama layer computes from that config at inference
(``get_rope``): for YaRN the blend of interpolated and extrapolated frequencies between the ``beta_fast``/
``beta_slow`` correction dimensions, and cos/sin scaled by ``0.1·ln(factor) + 1`` times
``attn_factor``. vLLM's Llama YaRN ignores ``mscale``/``mscale_all_dim`` (DeepSeek's own attention uses
them), and transformers would not, so :func:`draft_scaling` leaves them out of the draft's config:
then both compute the same.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED = ("default", "linear", "llama3", "yarn")
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attn_factor",
              "extrapolation_factor")


def scaling_type(scaling: dict[str, Any] | None) -> str:
    if not scaling:
        return "default"
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


def draft_scaling(target_text_config: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the draft's ``rope_scaling``, a warning or None) from the target's text config."""
    scaling = target_text_config.get("rope_scaling")
    params = target_text_config.get("rope_parameters")
    if not scaling and isinstance(params, dict) and scaling_type(params) != "default":
        scaling = params
    kind = scaling_type(scaling)
    if kind == "default":
        return None, None
    if kind not in SUPPORTED:
        return None, (f"the target's rope scaling {kind!r} is not supported by the draft; it is trained and "
                      "exported with plain RoPE (rope_theta only)")
    keep = {k: v for k, v in scaling.items() if k not in ("type", "rope_type", "rope_theta", "mscale",
                                                          "mscale_all_dim")}
    if kind == "yarn":
        keep = {k: v for k, v in keep.items() if k in _YARN_KEYS}
    return {"rope_type": kind, **keep}, None


def inv_freq_and_scale(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim/2] fp32, the factor cos and sin are multiplied by)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = scaling_type(scaling)
    if kind == "default":
        return inv, 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        return _llama3(inv, factor, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, factor, scaling)
    raise ValueError(f"rope scaling {kind!r} is not supported (supported: {', '.join(SUPPORTED)})")


def _llama3(inv: torch.Tensor, factor: float, s: dict[str, Any]) -> torch.Tensor:
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, theta: float, factor: float, s: dict[str, Any]) -> tuple[torch.Tensor, float]:
    orig = float(s["original_max_position_embeddings"])
    beta_fast, beta_slow = float(s.get("beta_fast", 32)), float(s.get("beta_slow", 1))

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero, as the reference does
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = (1 - ramp) * float(s.get("extrapolation_factor", 1.0))
    pos = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv = (1.0 / (factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate
    mscale = (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0) * float(s.get("attn_factor", 1.0))
    return inv, mscale
