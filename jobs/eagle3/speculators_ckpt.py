"""A trained draft as speculators writes its own EAGLE-3 checkpoints:
``PYTHONPATH=jobs python -m eagle3.speculators_ckpt DRAFT DST [--verifier NAME] [--tokens N]``.

``eagle3.train`` writes the draft as vLLM's ``llama_eagle3.py`` loads it (a Llama ``config.json``,
tensors ``midlayer.*``). speculators (vllm-project/speculators, ``src/speculators/models/eagle3.py``
and ``src/speculators/models/eagle3/config.py``, followed here) saves an ``Eagle3Speculator``:

- ``config.json``: ``speculators_model_type: "eagle3"``, ``architectures: ["Eagle3Speculator"]``, the
  decoder layer's Llama config under ``transformer_layer_config``, ``draft_vocab_size``,
  ``norm_before_residual``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` and
  ``speculators_config`` (algorithm, one greedy proposal method with ``speculative_tokens``, the verifier);
  vLLM reads the speculative settings from that block.
- tensors: the decoder layer as ``layers.0.*`` (ours: ``midlayer.*``); ``fc``, ``norm``, ``lm_head``,
  ``d2t``, ``t2d`` by the same names. ``fc`` has no bias, in speculators (0.9.0: ``nn.Linear(...,
  bias=False)``) as in vLLM (``llama_eagle3.py``: ``ReplicatedLinear(..., bias=False)``), and none is
  written: vLLM's loader raises ``KeyError: 'fc.bias'`` on one, speculators reports it unexpected.

The verifier (``speculators_config.verifier.name_or_path``) is what speculators' ``from_pretrained``
reads the embeddings and ``lm_head`` from: an empty one makes it fail (FileNotFoundError). By default it
is the draft's own target, recorded by ``eagle3.train`` in ``train_info.json`` (``target_model``: the
extraction's ``--model``, or train's ``--target-model``); ``--verifier`` overrides it (e.g. a hub name for
the serving host, where the local path means nothing).

Not written: ``embed_tokens.weight``. This draft never trains the embeddings (it reads the target's, as
speculators does with ``embed_requires_grad: false``); vLLM shares the target's embeddings with a draft
whose checkpoint lacks them. A loader that insists on them gets them from the target.

The weights are rewritten (renamed tensors cannot be hard-linked); ``train_info.json`` is hard-linked.
Lines: ``speculators checkpoint: {n} tensors into {dst} (verifier {name}, {k} speculative tokens)``;
a draft that cannot be read is one line, exit 78.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _io
from .draft import DraftConfig

EXIT_CONFIG = 78
OURS, THEIRS = "midlayer.", "layers.0."
# speculators' Eagle3DecoderLayer runs hidden_norm after the residual is kept (norm_before_residual false),
# as this draft's MidLayer does.
NORM_BEFORE_RESIDUAL = False


class CheckpointError(ValueError):
    """The draft cannot be written as a speculators checkpoint."""


def rename(name: str) -> str:
    return THEIRS + name[len(OURS):] if name.startswith(OURS) else name


def config(vllm_cfg: dict[str, Any], verifier: str, tokens: int) -> dict[str, Any]:
    """speculators' ``config.json`` for the draft whose vLLM ``config.json`` is ``vllm_cfg``."""
    if tokens < 1:
        raise CheckpointError(f"--tokens {tokens}: at least 1 speculative token")
    try:
        c = DraftConfig.from_vllm_config(vllm_cfg)
    except KeyError as e:
        raise CheckpointError(f"config.json lacks {e}: not an eagle3.train draft") from None
    layer = {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
             "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": c.hidden_act,
             "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
             "rope_theta": c.rope_theta, "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
             "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
             "vocab_size": c.vocab_size}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": NORM_BEFORE_RESIDUAL,
        "target_hidden_size": vllm_cfg.get("target_hidden_size") or c.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layer_ids),
        "embed_requires_grad": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(tokens),
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier, "architectures": list(vllm_cfg.get("verifier_architectures")
                                                                          or [])},
        },
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


def tensors(ours: dict[str, Any]) -> dict[str, Any]:
    """Our ``model.safetensors`` tensors under speculators' names (the same set: no ``fc.bias``)."""
    out = {rename(k): v for k, v in ours.items()}
    if "fc.weight" not in out:
        raise CheckpointError("model.safetensors has no fc.weight: not an eagle3.train draft")
    if "fc.bias" in out:
        raise CheckpointError("model.safetensors has an fc.bias, which neither speculators' nor vLLM's EAGLE-3 "
                              "draft has: not an eagle3.train draft")
    return {k: out[k].contiguous() for k in sorted(out)}


def recorded_verifier(src: Path) -> str:
    """The target the draft was trained for, as ``eagle3.train`` recorded it (train_info.json)."""
    try:
        info = json.loads((src / "train_info.json").read_text())
    except (OSError, ValueError):
        info = {}
    target = info.get("target_model") if isinstance(info, dict) else None
    if not target:
        raise CheckpointError(f"{src} has no train_info.json naming the target model: pass --verifier "
                              "(speculators loads the embeddings and lm_head from it)")
    return str(target)


def write(src: Path, dst: Path, verifier: str, tokens: int) -> tuple[int, str]:
    """Write the checkpoint; (tensors written, the verifier recorded)."""
    from safetensors.torch import load_file

    try:
        cfg = json.loads((src / "config.json").read_text())
        ours = load_file(str(src / "model.safetensors"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{src}: no readable config.json and model.safetensors ({e}); "
                              "pass an eagle3.train --out directory") from None
    if dst.resolve() == src.resolve():
        raise CheckpointError("DST is the draft's own directory: write into a new one")
    out_cfg = config(cfg, verifier or recorded_verifier(src), tokens)
    out = tensors(ours)
    dst.mkdir(parents=True, exist_ok=True)
    _io.atomic_save_safetensors(out, dst / "model.safetensors")
    if (src / "train_info.json").is_file():
        _io.place_file(src / "train_info.json", dst / "train_info.json", move=False)
    _io.atomic_write_json(out_cfg, dst / "config.json")
    return len(out), str(out_cfg["speculators_config"]["verifier"]["name_or_path"])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.speculators_ckpt",
                                 description="Write a trained draft as a speculators EAGLE-3 checkpoint.")
    ap.add_argument("draft", help="an eagle3.train --out directory (config.json, model.safetensors)")
    ap.add_argument("dst", help="the directory to write")
    ap.add_argument("--verifier", default="", help="the target's name or path (speculators_config.verifier; "
                                                   "default: the target recorded in train_info.json)")
    ap.add_argument("--tokens", type=int, default=3, help="speculative tokens of the proposal method (3)")
    args = ap.parse_args(argv)
    try:
        n, verifier = write(Path(args.draft), Path(args.dst), args.verifier, args.tokens)
    except CheckpointError as e:
        print(f"speculators checkpoint error: {e}", flush=True)
        return EXIT_CONFIG
    print(f"speculators checkpoint: {n} tensors into {args.dst} (verifier {verifier}, "
          f"{args.tokens} speculative tokens)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
