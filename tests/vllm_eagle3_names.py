"""vLLM's EAGLE-3 draft weight loading, transcribed for its names and shapes (vLLM cannot be installed here).

Read in vllm-project/vllm, ``vllm/model_executor/models/llama_eagle3.py`` (commit 00bd1493b3e8; the loading
code the issue ran from the 0.23.0 wheel on the CPU, where ``fc.bias`` raised ``KeyError: 'fc.bias'``):

* ``Eagle3LlamaForCausalLM.load_weights``: a name holding ``t2d`` is dropped; ``d2t`` becomes
  ``draft_id_to_target_id``; ``mask_hidden`` is dropped unless parallel drafting; every other name without
  ``lm_head`` gets a ``model.`` prefix. Then ``AutoWeightsLoader`` (skipping ``draft_id_to_target_id`` and
  ``embed_tokens`` when the checkpoint has none) hands ``model.*`` to ``LlamaModel.load_weights`` with the
  prefix taken off, and loads the rest (``lm_head.weight``, ``draft_id_to_target_id``) as parameters of the
  draft itself, refusing a name that is neither.
* ``LlamaModel.load_weights``: ``midlayer.`` becomes ``layers.0.``; ``.q_proj``/``.k_proj``/``.v_proj`` go
  into ``.qkv_proj`` and ``.gate_proj``/``.up_proj`` into ``.gate_up_proj`` (stacked); every name is then
  looked up in ``dict(self.named_parameters())``: a name it lacks raises ``KeyError``.
* The parameters: layer 0's ``qkv_proj`` reads ``2 * hidden_size`` inputs (embeddings and hidden state
  concatenated), without bias unless ``attention_bias``; ``o_proj``, ``gate_up_proj``, ``down_proj``, three
  norms (``input_layernorm``, ``post_attention_layernorm``, ``hidden_norm``); ``fc`` a ``ReplicatedLinear`` of
  ``3 * target_hidden_size`` inputs with ``bias=False``; ``norm``; ``lm_head`` of ``draft_vocab_size`` rows;
  ``draft_id_to_target_id`` of ``draft_vocab_size`` int64; ``embed_tokens`` (shared from the target when the
  checkpoint has none, as the proposer does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]


class UnknownWeight(ValueError):
    """AutoWeightsLoader's refusal of a name that is no module or parameter of the draft."""


def parameters(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The draft's parameters and their shapes, for a vLLM draft ``config.json`` (``num_hidden_layers``: 1)."""
    h = int(cfg["hidden_size"])
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    hd = int(cfg.get("head_dim") or h // heads)
    inter = int(cfg["intermediate_size"])
    draft_vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    target_h = int(cfg.get("target_hidden_size") or h)
    p: dict[str, tuple[int, ...]] = {
        "lm_head.weight": (draft_vocab, h),
        "draft_id_to_target_id": (draft_vocab,),
        "model.embed_tokens.weight": (int(cfg["vocab_size"]), h),
        "model.norm.weight": (h,),
        "model.fc.weight": (h, 3 * target_h),
    }
    for i in range(int(cfg.get("num_hidden_layers", 1))):
        pre = f"model.layers.{i}."
        p[pre + "self_attn.qkv_proj.weight"] = ((heads + 2 * kv) * hd, 2 * h if i == 0 else h)
        if cfg.get("attention_bias"):
            p[pre + "self_attn.qkv_proj.bias"] = ((heads + 2 * kv) * hd,)
        p[pre + "self_attn.o_proj.weight"] = (h, heads * hd)
        p[pre + "mlp.gate_up_proj.weight"] = (2 * inter, h)
        p[pre + "mlp.down_proj.weight"] = (h, inter)
        for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
            p[pre + norm + ".weight"] = (h,)
    return p


def _shard_rows(cfg: Mapping[str, Any], shard: Any) -> int:
    h = int(cfg["hidden_size"])
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    hd = int(cfg.get("head_dim") or h // heads)
    return {"q": heads * hd, "k": kv * hd, "v": kv * hd}.get(shard, int(cfg["intermediate_size"]))


def load(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> set[str]:
    """Load a checkpoint's ``{name: shape}`` as vLLM does; the parameters loaded, or the error vLLM raises
    (``KeyError`` from ``LlamaModel.load_weights``, :class:`UnknownWeight` from ``AutoWeightsLoader``,
    ``ValueError`` for a shape its weight loader would refuse)."""
    params = parameters(cfg)
    model_weights: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "mask_hidden" in name:
            continue  # not a parallel-drafting config
        elif "lm_head" not in name:
            name = "model." + name
        model_weights[name] = shape
    loaded: set[str] = set()
    for name, shape in model_weights.items():
        if not name.startswith("model."):
            if name not in params:
                raise UnknownWeight(f"There is no module or parameter named '{name}' in Eagle3LlamaForCausalLM")
            _check(name, shape, params[name])
            loaded.add(name)
            continue
        inner = name[len("model."):]
        if "midlayer." in inner:
            inner = inner.replace("midlayer.", "layers.0.")
        inner_params = {k[len("model."):]: v for k, v in params.items() if k.startswith("model.")}
        for param_name, weight_name, shard in STACKED:
            if weight_name not in inner:
                continue
            inner = inner.replace(weight_name, param_name)
            want = inner_params[inner]  # KeyError, as vLLM's params_dict[name]
            _check(name, shape, (_shard_rows(cfg, shard), want[1]))
            break
        else:
            _check(name, shape, inner_params[inner])  # KeyError, as vLLM's params_dict[name]
        loaded.add("model." + inner)
    return loaded


def _check(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"{name}: shape {tuple(got)}, the parameter takes {tuple(want)}")
