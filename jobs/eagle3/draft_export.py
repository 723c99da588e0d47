"""A trained draft with its auxiliary layer ids in another engine's numbering:
``PYTHONPATH=jobs python -m eagle3.draft_export DRAFT DST --numbering sglang|vllm``.

``eagle3.train`` writes ``eagle_aux_hidden_state_layer_ids`` (top level and in ``eagle_config``) in vLLM's
numbering, the one extraction uses: id k is the input of decoder layer k. SGLang (and SpecForge, which
trains for it) numbers them one lower: its targets capture, for a configured id k, the output of layer k,
i.e. the input of layer k + 1 (``set_eagle3_layers_to_capture`` adds 1). SpecForge's DeepSeek-V3 draft
config lists ``[1, 29, 57]`` for what vLLM calls ``[2, 30, 58]``, this job's default for 61 layers.
Served by SGLang with vLLM's ids, the draft would read each auxiliary state one layer late.

``DST`` gets ``config.json`` with both id lists shifted (and ``eagle3_layer_numbering`` saying which numbering
they are in; a config without it is vLLM's, as ``eagle3.train`` writes it) and the draft's other files,
``model.safetensors`` and ``train_info.json``, hard-linked (copied where linking is refused): the weights do
not depend on the numbering. An id that would fall below 0 is refused (exit 78, one line), as is ``DST`` =
``DRAFT``. Lines: ``draft export: {n} files into {dst}, layer ids {ids} ({numbering} numbering)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _io

NUMBERINGS = ("vllm", "sglang")
SHIFT = {"vllm": 0, "sglang": -1}  # added to a vLLM-numbered id
KEY = "eagle3_layer_numbering"
FILES = ("model.safetensors", "train_info.json")
EXIT_CONFIG = 78


class NumberingError(ValueError):
    """The ids cannot be written in the numbering asked for."""


def renumber(ids: Sequence[int], src: str, dst: str) -> list[int]:
    """Auxiliary layer ids in numbering ``src`` as numbering ``dst`` would write them."""
    out = [int(k) - SHIFT[src] + SHIFT[dst] for k in ids]
    if any(k < 0 for k in out):
        raise NumberingError(f"layer ids {list(ids)} ({src} numbering) have no {dst} numbering: {out} would "
                             "hold a negative id (the embeddings' output cannot be named there)")
    return out


def convert(cfg: dict[str, Any], numbering: str) -> dict[str, Any]:
    """The draft's ``config.json`` with its auxiliary layer ids in ``numbering``."""
    src = str(cfg.get(KEY) or "vllm")
    if src not in NUMBERINGS:
        raise NumberingError(f"config.json says {KEY} {src!r}; known: {', '.join(NUMBERINGS)}")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        raise NumberingError("config.json has no eagle_aux_hidden_state_layer_ids: not an EAGLE-3 draft")
    new = renumber(ids, src, numbering)
    out = {**cfg, "eagle_aux_hidden_state_layer_ids": new, KEY: numbering}
    out["eagle_config"] = {**(cfg.get("eagle_config") or {"use_aux_hidden_state": True}),
                           "eagle_aux_hidden_state_layer_ids": new}
    return out


def export(src: Path, dst: Path, numbering: str) -> tuple[int, list[int]]:
    try:
        cfg = json.loads((src / "config.json").read_text())
    except (OSError, ValueError):
        raise NumberingError(f"{src} has no readable config.json: pass an eagle3.train --out directory") from None
    if dst.resolve() == src.resolve():
        raise NumberingError("DST is the draft's own directory: write into a new one")
    out = convert(cfg, numbering)
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for name in FILES:
        if (src / name).is_file():
            _io.place_file(src / name, dst / name, move=False)
            n += 1
    _io.atomic_write_json(out, dst / "config.json")
    return n + 1, out["eagle_aux_hidden_state_layer_ids"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.draft_export",
                                 description="Write a trained draft with its layer ids in vLLM's or SGLang's "
                                             "numbering.")
    ap.add_argument("draft", help="an eagle3.train --out directory (config.json, model.safetensors)")
    ap.add_argument("dst", help="the directory to write")
    ap.add_argument("--numbering", choices=NUMBERINGS, required=True,
                    help="sglang: one lower than vLLM's (SGLang, SpecForge); vllm: as eagle3.train writes them")
    args = ap.parse_args(argv)
    try:
        n, ids = export(Path(args.draft), Path(args.dst), args.numbering)
    except NumberingError as e:
        print(f"draft export error: {e}", flush=True)
        return EXIT_CONFIG
    print(f"draft export: {n} files into {args.dst}, layer ids {ids} ({args.numbering} numbering)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
