"""The EAGLE-3 draft model (arXiv 2503.01840), in plain torch, with vLLM's weight names.

Shapes: ``H`` the target's hidden size (the draft's too: it shares the target's embeddings),
``A`` the number of auxiliary layers (3), ``V`` the target vocabulary, ``Vd`` the draft vocabulary.

* ``fc`` (A·H → H, no bias) fuses the auxiliary hidden states (low, mid, high layers of the target);
* ``midlayer``: one Llama decoder layer whose attention input is
  ``cat(input_layernorm(embed(token_{t+1})), hidden_norm(h_t))`` (width 2H, so q/k/v take 2H); the
  attention residual is ``h_t`` itself; then ``post_attention_layernorm`` and a SiLU-gated MLP;
* ``norm`` and ``lm_head`` (H → Vd) give logits over the draft vocabulary; draft id ``d`` is target
  id ``d + d2t[d]``; ``t2d`` is the boolean mask of the target ids in the draft vocabulary.

The output of ``midlayer`` before ``norm`` is the hidden state fed to the next drafting step, as in
vLLM (``hidden_prenorm``). The embeddings are not part of the module: they stay the target's (frozen),
and vLLM shares the target's at inference.

Training-time test (:meth:`Eagle3Draft.step`): step 0 attends causally over the sequence; step
``i > 0`` (its query at position ``t`` stands for sequence position ``t + i``) attends to the step-0
keys at positions ``<= t`` plus its own keys of steps ``1..i`` at position ``t`` only, with rotary
positions ``t + i``, which is what the drafter sees at inference after ``i`` drafted tokens.

Rotary embedding: the target's ``rope_theta`` and rope scaling (linear, llama3, YaRN: see :mod:`.rope`),
written into the exported config, so vLLM runs the draft exactly as it was trained.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import rope

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layer_ids: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    rope_scaling: dict[str, Any] | None = None  # the target's (see rope.draft_scaling); None: plain RoPE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["rope_scaling"] is None:
            del d["rope_scaling"]  # so that runs of plain RoPE keep the fingerprint they had
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def from_vllm_config(cls, c: dict[str, Any]) -> DraftConfig:
        """The inverse of :meth:`vllm_config`."""
        params = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or (params if rope.scaling_type(params) != "default" else None)
        return cls(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                   num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   vocab_size=c["vocab_size"], draft_vocab_size=c.get("draft_vocab_size") or c["vocab_size"],
                   aux_layer_ids=list(c.get("eagle_aux_hidden_state_layer_ids") or []),
                   rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                   rope_theta=c.get("rope_theta") or params.get("rope_theta") or 10000.0,
                   max_position_embeddings=c.get("max_position_embeddings", 2048),
                   hidden_act=c.get("hidden_act", "silu"),
                   rope_scaling=({k: v for k, v in scaling.items() if k != "rope_theta"} if scaling else None))

    def vllm_config(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """``config.json`` of the exported draft, as vLLM's ``llama_eagle3.py`` reads it."""
        cfg = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_parameters": {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                             "use_aux_hidden_state": True},
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
        }
        cfg.update(extra or {})
        return cfg


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Rotary:
    """cos/sin tables of RoPE (with the target's scaling, if any), grown on demand."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None):
        self.head_dim = head_dim
        self.theta = theta
        self.inv_freq, self.mscale = rope.inv_freq_and_scale(head_dim, theta, scaling)
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def tables(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos is None or self._cos.shape[0] < n or self._cos.device != device:
            t = torch.arange(max(n, 64), dtype=torch.float32, device=device)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin = emb.cos() * self.mscale, emb.sin() * self.mscale
        return self._cos, self._sin

    def apply(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """``x`` [B, heads, T, hd] at positions ``offset .. offset+T-1``."""
        t = x.shape[2]
        cos, sin = self.tables(offset + t, x.device)
        cos = cos[offset:offset + t].to(x.dtype)
        sin = sin[offset:offset + t].to(x.dtype)
        return x * cos + _rotate_half(x) * sin


def ttt_mask(t: int, step: int, device: torch.device) -> torch.Tensor:
    """Boolean attention mask [T, (step+1)·T]: causal over step 0's keys, diagonal over later steps'."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    if step == 0:
        return causal
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if nh % nkv:
            raise ValueError(f"num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.rotary = Rotary(hd, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, x: torch.Tensor, cache: tuple[list[torch.Tensor], list[torch.Tensor]],
                step: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = self.rotary.apply(q, step)
        k = self.rotary.apply(k, step)
        cache[0].append(k)
        cache[1].append(v)
        keys = torch.cat(cache[0], dim=2) if step else k
        values = torch.cat(cache[1], dim=2) if step else v
        if self.nkv != self.nh:
            rep = self.nh // self.nkv
            keys = keys.repeat_interleave(rep, dim=1)
            values = values.repeat_interleave(rep, dim=1)
        mask = ttt_mask(t, step, x.device)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0 / math.sqrt(self.hd))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: only silu is supported")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor,
                cache: tuple[list[torch.Tensor], list[torch.Tensor]], step: int) -> torch.Tensor:
        residual = hidden
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        h = residual + self.self_attn(x, cache, step)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    """The trainable draft. Parameter and buffer names are those of the exported checkpoint."""

    def __init__(self, cfg: DraftConfig, n_aux: int = 3):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(n_aux * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """[B, T, A·H] auxiliary hidden states → [B, T, H] (step 0's input hidden state)."""
        return self.fc(aux)

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor,
             cache: tuple[list[torch.Tensor], list[torch.Tensor]], step: int) -> torch.Tensor:
        """One drafting step; returns the pre-norm hidden state (the next step's input)."""
        return self.midlayer(embeds, hidden, cache, step)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def draft_vocab(freq: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of the ``k`` most frequent target ids (ties: the lower id first).

    The chosen ids are sorted ascending, as in the EAGLE-3 reference, so ``d2t`` (draft id →
    offset: ``target = draft + d2t[draft]``) is non-negative and non-decreasing.
    """
    v = freq.numel()
    if not 1 <= k <= v:
        raise ValueError(f"draft vocabulary size {k} must lie in 1..{v}")
    # A stable descending sort keeps equal counts in ascending id order.
    order = torch.sort(freq.to(torch.int64), descending=True, stable=True).indices
    used = torch.sort(order[:k]).values
    d2t = used - torch.arange(k, dtype=torch.int64)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def export_tensors(model: Eagle3Draft, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors``: weights in ``dtype``, ``d2t`` int64, ``t2d`` bool."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        out[name] = t if name in ("d2t", "t2d") else t.to(dtype)
    return {k: v.contiguous() for k, v in sorted(out.items())}
