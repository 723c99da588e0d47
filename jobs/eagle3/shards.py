"""Sharded extraction: ``--shard I --num-shards N`` and ``python -m eagle3.extract gather --out DIR``.

Shard I takes the samples of the fixed batches ``[k*B, (k+1)*B)`` (B: ``--batch-size``) with
``k % N == I``: every shard reads the whole prompt set and keeps its part, which depends on
nothing but the global record index.  Whole batches, because a sample's hidden states depend,
in their last bits, on the batch it was computed in: a shard computes each of its samples in
the batch an unsharded run computes it in, so its files are the same bytes.  Its
``hs_{i}`` files keep their global indices, in the one ``--out`` all shards share, so the union
of the N shards' files is the unsharded output.  Each shard writes its own
``manifest.shard-I-of-N.json``, ``token_freq.shard-I-of-N.safetensors`` (counts over its
part) and ``prepared.shard-I-of-N.safetensors`` (the whole tokenised set, the same in every shard:
the loss masks of sample files renamed into place without one), and never the files that describe
the whole set.

``gather`` checks that every shard is there, complete, and made with the same settings, then
writes ``token_freq.safetensors`` (the shards' counts summed), ``prepared.safetensors`` (shard 0's
``prepared.shard-0-of-N``, hard-linked; read back from the sample files for shards made before
there was one) and ``manifest.json`` (written last): the files the training job reads, as an
unsharded run writes them.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _io

_PARTIAL = re.compile(r"manifest\.shard-(\d+)-of-(\d+)\.json")
# What may differ between shards' manifests: each describes its own part.
_PER_SHARD = {"status", "finished", "failed", "shard", "verify"}


class GatherRefused(RuntimeError):
    """The shards' output cannot be gathered (one line says why)."""


def partial(kind: str, shard: int, num_shards: int, suffix: str) -> str:
    """A shard's own file: ``manifest.shard-0-of-4.json``."""
    return f"{kind}.shard-{shard}-of-{num_shards}{suffix}"


def check_args(shard: int, num_shards: int) -> None:
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"--shard {shard} --num-shards {num_shards}: need 0 <= shard < num-shards")


def select(indices: Sequence[int], shard: int, num_shards: int, batch_size: int) -> list[int]:
    """Shard ``shard``'s part of the set, by global record index: whole batches, dealt in turn."""
    return [i for i in indices if (i // batch_size) % num_shards == shard]


def check_partials(out: Path, fingerprint: dict[str, Any], num_shards: int, batch_size: int) -> str | None:
    """Why ``out`` cannot take this shard's output (another shard count or other settings), or None."""
    for path, shard, num in _partials(out):
        old = json.loads(path.read_text())
        if num != num_shards:
            return f"{out} holds shards of --num-shards {num} ({path.name}): use a new --out or the same count"
        diff = [k for k in fingerprint if (old.get("fingerprint") or {}).get(k) != fingerprint[k]]
        if (old.get("shard") or {}).get("batch_size") != batch_size:
            diff.append("batch_size (it decides which samples are whose)")
        if diff:
            return (f"{out} holds shard {shard}'s extraction made with other settings (differs in: "
                    f"{', '.join(diff)}); use a new --out")
    return None


def _partials(out: Path) -> list[tuple[Path, int, int]]:
    found = []
    for path in sorted(out.glob("manifest.shard-*-of-*.json")):
        m = _PARTIAL.fullmatch(path.name)
        if m:
            found.append((path, int(m.group(1)), int(m.group(2))))
    return found


def gather(out: Path) -> dict[str, Any]:
    """Merge the shards' manifests and token counts in ``out``; the merged manifest."""
    manifests = _complete_shards(out)
    first = manifests[0]
    for shard, m in enumerate(manifests):
        diff = sorted(k for k in set(first) | set(m) if k not in _PER_SHARD and first.get(k) != m.get(k))
        if diff:
            raise GatherRefused(f"shard {shard} was made with other settings than shard 0 (differs in: "
                                f"{', '.join(diff)}): extract it again into another --out")
    total = int(first["num_samples"])
    missing = [i for i in range(total) if not (out / f"hs_{i}.safetensors").is_file()]
    if missing:
        raise GatherRefused(f"{len(missing)} sample files are missing (first: hs_{missing[0]}.safetensors) although "
                            "every shard says complete: extract the shards again")
    num = len(manifests)
    _io.atomic_save_safetensors(_summed_token_freq(out, num), out / "token_freq.safetensors")
    whole = out / partial("prepared", 0, num, ".safetensors")
    if whole.is_file():
        _io.place_file(whole, out / "prepared.safetensors", move=False)
    else:
        _io.atomic_save_safetensors(_prepared(out, total), out / "prepared.safetensors")
    merged = {k: v for k, v in first.items() if k not in ("shard", "verify")}
    merged["finished"] = sum(int(m["finished"]) for m in manifests)
    merged["failed"] = sorted(i for m in manifests for i in m["failed"])
    merged["status"] = "complete"
    _io.atomic_write_json(merged, out / "manifest.json")
    return merged


def _complete_shards(out: Path) -> list[dict[str, Any]]:
    found = _partials(out)
    if not found:
        raise GatherRefused(f"{out} holds no shard manifests (manifest.shard-I-of-N.json): run the shards first "
                            "(--shard I --num-shards N)")
    counts = sorted({num for _, _, num in found})
    if len(counts) > 1:
        raise GatherRefused(f"{out} holds shards of different --num-shards ({', '.join(map(str, counts))}): "
                            "use one --out per shard count")
    num = counts[0]
    by_shard = {shard: path for path, shard, _ in found}
    absent = [i for i in range(num) if i not in by_shard]
    if absent:
        raise GatherRefused(f"shard {absent[0]} of {num} is missing (no {partial('manifest', absent[0], num, '.json')}"
                            f" in {out}): run it, then gather")
    manifests = []
    for shard in range(num):
        m = json.loads(by_shard[shard].read_text())
        if m.get("status") != "complete":
            raise GatherRefused(f"shard {shard} of {num} is {m.get('status')}: relaunch it, then gather")
        manifests.append(m)
    return manifests


def _summed_token_freq(out: Path, num: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    summed: dict[str, Any] = {}
    for shard in range(num):
        path = out / partial("token_freq", shard, num, ".safetensors")
        if not path.is_file():
            raise GatherRefused(f"shard {shard} of {num} has no {path.name}: relaunch it, then gather")
        for key, tensor in load_file(str(path)).items():
            summed[key] = summed[key] + tensor if key in summed else tensor
    return {"token_freq": summed["token_freq"], "token_freq_all": summed["token_freq_all"]}


def _prepared(out: Path, total: int) -> dict[str, Any]:
    """The tokenised set, as an unsharded run packs it, read back from the sample files."""
    import torch
    from safetensors import safe_open

    ids, masks, offsets = [], [], [0]
    for i in range(total):
        with safe_open(str(out / f"hs_{i}.safetensors"), framework="pt") as f:
            ids.append(f.get_tensor("token_ids"))
            masks.append(f.get_tensor("loss_mask"))
        offsets.append(offsets[-1] + len(ids[-1]))
    return {"token_ids": torch.cat(ids).to(torch.int64), "loss_mask": torch.cat(masks).to(torch.uint8),
            "offsets": torch.tensor(offsets, dtype=torch.int64)}


def gather_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.extract gather",
                                 description="merge the shards' manifests and token counts into --out's manifest.json")
    ap.add_argument("--out", required=True, help="the directory every shard wrote into")
    args = ap.parse_args(argv)
    try:
        merged = gather(Path(args.out))
    except GatherRefused as e:
        print(f"extract gather refused: {e}", flush=True)
        return 78  # EX_CONFIG, as extract's other refusals
    print(f"extract gathered: {merged['num_samples']} samples, {merged['total_tokens']} tokens into {args.out}",
          flush=True)
    return 0
