"""EAGLE-3 draft training: ``PYTHONPATH=jobs python -m eagle3.train --data DIR --out DIR [options]``.

Input (``--data``, the output of ``eagle3.extract``): ``manifest.json`` (target model path, layer ids
in vLLM numbering, layer count, hidden size, sample count), ``hs_{i}.safetensors`` per sample
(``hidden_states`` bf16 ``[T, n_layers, H]``, ``token_ids`` int64 ``[T]``, ``loss_mask`` ``[T]``) and
``token_freq.safetensors`` (``token_freq``: counts over loss-masked tokens, int64 ``[vocab]``;
``token_freq.json`` mapping token id → count is read too). The last captured layer id must be L
(the last decoder layer's output before the final norm); the others (3 of them: low, mid, high)
are the draft's auxiliary inputs. From the target checkpoint (``--target-model``, default: the
manifest's ``model``) only three tensors are read: the embeddings (frozen draft input), the final
norm and ``lm_head`` (the target's logits, ``lm_head(norm(h_L))``).

Training (EAGLE-3, arXiv 2503.01840): draft position ``t`` gets ``fc(aux_t)`` and the embedding of
token ``t+1`` and predicts token ``t+2``; its target is the target model's distribution at position
``t+1`` restricted to the draft vocabulary (the ``--draft-vocab`` most frequent loss-masked tokens).
Training-time test unrolls ``--ttt-steps`` steps (default 3); step ``i > 0`` feeds the draft's own
output hidden state of step ``i-1`` and predicts token ``t+2+i``. Loss of step ``i``: KL(target ‖
draft) over the draft vocabulary (the reference's soft cross-entropy minus the target's entropy:
the same gradients, and 0 for a perfect draft), summed over positions whose predicted token has
``loss_mask`` 1 and whose target argmax lies in the draft vocabulary (the reference masks the
others), divided by the number of loss-masked positions (the mask is read at the predicted token;
the reference reads it at ``t+i``); the total is ``sum_i decay**i * loss_i``
(``--ttt-decay`` 0.8). ``acc_i``: the draft's argmax equals the target's argmax, over the
loss-masked positions (a target argmax outside the draft vocabulary counts as a miss).

Optimiser: AdamW, linear warmup then cosine decay, gradient clipping; fp32 weights, bf16 autocast
on CUDA (``--dtype``; the CPU default is fp32). One device: the CPU or a single GPU.

Output (``--out``): ``config.json`` and ``model.safetensors`` of the draft in the layout vLLM loads as
an EAGLE-3 speculator (``llama_eagle3.py``: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``; no embeddings), ``train_info.json``, and ``checkpoints/step_{N}/`` (see :mod:`._ckpt`) every
``--save-every`` steps and at the end, the newest ``--keep`` kept. A relaunch resumes from the newest
usable checkpoint (model, optimiser, scheduler, data position in the seeded per-epoch permutation,
RNG states) and gives the same weights as an uninterrupted run.

Reading order (``--order``): ``shuffled`` (a seeded permutation per epoch), ``index`` (sample 0, 1, ...), or
``stream``: index order on an extraction still being written by ``eagle3.extract --disk-budget``, one epoch, each
sample released (recorded in ``consumed.json``, then deleted) once a saved checkpoint holds it (eagle3.budget).

Lines for the supervisor's probes (each flushed)::

    train phase: model_init | training
    train step {step}/{total} loss={loss:.4f} acc0={acc:.3f} tok/s={tps:.1f} loss_0=… acc_0=… loss_1=…
    train checkpoint saved: step {step} path {path}
    train resumed from step {step} ({path})
    train checkpoint {path} is unusable ({why}); falling back to the previous one
    train done: {steps} steps
    train loss is not finite at step {step}        (then FloatingPointError: non-zero exit)
    train waiting: sample {i} not extracted yet (...; {s}s)   (--order stream; every --wait-report-s)
    train waited {s:.1f}s for its samples                    (--order stream)
    train released: samples 0..{k} consumed ({n} bytes freed)

Test hooks (environment variables; for tests only, never set in production):

* ``EAGLE3_TRAIN_INJECT_NAN_AT=N``: the loss of step N (1-based) is made NaN;
* ``EAGLE3_TRAIN_STEP_DELAY_S=X``: sleep X seconds after each step (so a killer lands mid-run).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import _dist, _io, budget, draft_shape, formats
from ._ckpt import Checkpoints
from .draft import DraftConfig, Eagle3Draft, draft_vocab, export_tensors

INFO_FORMAT = "eagle3-draft/1"


def say(line: str) -> None:
    _dist.say_once(line)  # rank 0 speaks for the run


class DataError(ValueError):
    """The extraction output cannot be trained on."""


class OutputMismatch(RuntimeError):
    """--out holds checkpoints of a run with other settings."""


# --------------------------------------------------------------------------------------------- data

@dataclass
class Dataset:
    root: Path
    reader: formats.Reader
    manifest: dict[str, Any]
    indices: list[int]  # samples present and complete
    layer_ids: list[int]
    aux_pos: list[int]  # positions of the auxiliary layers in the stored layer axis
    last_pos: int  # position of layer id L
    hidden: int
    max_len: int

    def __len__(self) -> int:
        return len(self.indices)

    def path(self, i: int) -> Path:
        return self.reader.path(i)

    def load(self, i: int) -> dict[str, torch.Tensor]:
        d = self.reader.load(i)
        hs = d.hidden_states[: self.max_len]
        return {"aux": hs[:, self.aux_pos].flatten(1), "last": hs[:, self.last_pos],
                "ids": d.token_ids[: self.max_len].to(torch.int64),
                "mask": d.loss_mask[: self.max_len].to(torch.bool)}

    def batch(self, sample_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """Right-padded batch: aux [B,T,A·H], last [B,T,H] (bf16), ids [B,T], mask [B,T], lengths [B]."""
        items = [self.load(self.indices[j]) for j in sample_ids]
        t = max(it["ids"].shape[0] for it in items)
        b = len(items)
        aux = torch.zeros(b, t, items[0]["aux"].shape[1], dtype=items[0]["aux"].dtype)
        last = torch.zeros(b, t, self.hidden, dtype=items[0]["last"].dtype)
        ids = torch.zeros(b, t, dtype=torch.int64)
        mask = torch.zeros(b, t, dtype=torch.bool)
        lengths = torch.zeros(b, dtype=torch.int64)
        for k, it in enumerate(items):
            n = it["ids"].shape[0]
            aux[k, :n], last[k, :n], ids[k, :n], mask[k, :n] = it["aux"], it["last"], it["ids"], it["mask"]
            lengths[k] = n
        return {"aux": aux, "last": last, "ids": ids, "mask": mask, "lengths": lengths}


def _manifest(root: Path, fmt: formats.Format, reader: formats.Reader,
              layer_ids_flag: str | None) -> dict[str, Any]:
    """Our manifest, or (speculators' own data, which has none) one made from the files and --layer-ids."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except FileNotFoundError:
        if fmt is not formats.Format.SPECULATORS:
            raise DataError(f"--data {root}: no manifest.json (run eagle3.extract into it first)") from None
        manifest = {"num_samples": len(reader), "status": "speculators data (no manifest)"}
    except ValueError as e:
        raise DataError(f"--data {root}: manifest.json is not valid JSON ({e})") from None
    if layer_ids_flag:
        manifest["layer_ids"] = [int(x) for x in layer_ids_flag.split(",") if x.strip()]
    if "layer_ids" not in manifest:
        raise DataError(f"--data {root}: speculators' layout stores no layer ids; pass --layer-ids A,B,C,L "
                        "(the ids the hidden states were captured at, vLLM numbering, L the last layer)")
    manifest.setdefault("num_hidden_layers", manifest["layer_ids"][-1])
    if "hidden_size" not in manifest:
        h = reader.header(0)
        if h is None:
            raise DataError(f"--data {root}: sample 0 ({reader.path(0)}) is missing or incomplete")
        manifest["hidden_size"] = h["hidden_states"]["shape"][2]
    return manifest


def _await_manifest(root: Path, report_s: float = budget.REPORT_S) -> None:
    """--order stream may start before extraction: wait for its manifest (written after token_freq)."""
    wait = budget.Waiting(_dist.say_once, report_s)
    while not (root / "manifest.json").is_file():
        wait.tick(lambda secs: f"train waiting: no manifest.json in {root} yet (the extraction has not started; "
                               f"{secs:.0f}s)")
        time.sleep(budget.POLL_S * 4)


def open_dataset(root: str | os.PathLike[str], max_len: int, layer_ids_flag: str | None = None,
                 stream: bool = False, report_s: float = budget.REPORT_S) -> Dataset:
    """The extraction output in ``root``; with ``stream``, one still being written (every sample counts,
    present or not: :func:`await_samples` waits for each before it is read)."""
    root = Path(root)
    if stream:
        _await_manifest(root, report_s)
    fmt = formats.detect(root)
    if stream and fmt is not formats.Format.SUPERVISE:
        raise DataError(f"--data {root}: --order stream reads the supervise layout only ({fmt.value} found)")
    try:
        reader = formats.Reader(root, fmt)
    except formats.FormatError as e:
        raise DataError(f"--data {root}: {e}") from None
    manifest = _manifest(root, fmt, reader, layer_ids_flag)
    layer_ids = [int(k) for k in manifest["layer_ids"]]
    num_layers = int(manifest["num_hidden_layers"])
    hidden = int(manifest["hidden_size"])
    if layer_ids != sorted(layer_ids) or layer_ids[-1] != num_layers:
        raise DataError(f"--data {root}: layer ids {layer_ids} must be ascending and end with {num_layers} "
                        "(the last layer's output, for the target's logits)")
    aux_pos = list(range(len(layer_ids) - 1))
    if len(aux_pos) != 3:
        raise DataError(f"--data {root}: {len(aux_pos)} auxiliary layers ({layer_ids[:-1]}); EAGLE-3 (and vLLM's "
                        f"fc of 3·hidden inputs) needs exactly 3 besides the last layer {num_layers}")
    n = int(manifest["num_samples"])
    if stream:
        return Dataset(root, reader, manifest, list(range(n)), layer_ids, aux_pos, len(layer_ids) - 1, hidden, max_len)
    present = []
    for i in range(n):
        h = reader.header(i)
        if h is None:
            continue
        shape = h["hidden_states"]["shape"]
        if shape[1:] != [len(layer_ids), hidden]:
            raise DataError(f"{reader.path(i)}: hidden_states shape {shape}, "
                            f"expected [T, {len(layer_ids)}, {hidden}]")
        present.append(i)
    if not present:
        raise DataError(f"--data {root}: none of the {n} samples is there yet")
    if len(present) < n:
        _dist.say_once(f"train warning: {n - len(present)} of {n} samples are missing in {root} "
                       f"(extraction status: {manifest.get('status')}); training on the {len(present)} present")
    return Dataset(root, reader, manifest, present, layer_ids, aux_pos, len(layer_ids) - 1, hidden, max_len)


def token_frequencies(root: Path, vocab: int, ds: Dataset | None = None) -> torch.Tensor:
    """Counts per target token id over loss-masked tokens, int64 [vocab]."""
    freq = None
    st = root / "token_freq.safetensors"
    js = root / "token_freq.json"
    pt = root / "token_freq.pt"  # speculators': torch.save of {token id: count}
    if not st.is_file() and not js.is_file() and pt.is_file():
        counts = {int(k): int(c) for k, c in torch.load(pt, weights_only=True).items()}
        freq = torch.zeros(max([vocab] + [k + 1 for k in counts]), dtype=torch.int64)
        for k, c in counts.items():
            freq[k] = c
    elif st.is_file():
        from safetensors.torch import load_file

        d = load_file(str(st))
        freq = d.get("token_freq")
        if freq is not None and int(freq.sum()) == 0 and "token_freq_all" in d:
            freq = d["token_freq_all"]  # no loss-masked token at all: fall back to every token
    elif js.is_file():
        counts = json.loads(js.read_text())
        freq = torch.zeros(max([vocab] + [int(k) + 1 for k in counts]), dtype=torch.int64)
        for k, c in counts.items():
            freq[int(k)] = int(c)
    elif ds is not None:
        freq = torch.zeros(vocab, dtype=torch.int64)
        for i in ds.indices:
            it = ds.load(i)
            freq += torch.bincount(it["ids"][it["mask"]], minlength=vocab)[:vocab]
    if freq is None:
        raise DataError(f"--data {root}: no token_freq.safetensors or token_freq.json")
    freq = freq.to(torch.int64).flatten()
    if freq.numel() < vocab:
        freq = torch.cat([freq, torch.zeros(vocab - freq.numel(), dtype=torch.int64)])
    return freq[:vocab]


def permutation(n: int, seed: int, epoch: int, order: str = "shuffled") -> list[int]:
    """The dataset positions of an epoch: seeded and shuffled, or (``index``, ``stream``) in index order."""
    if order != "shuffled":
        return list(range(n))
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


# ------------------------------------------------------------------------------------------- target

def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg if "num_hidden_layers" in cfg else (cfg.get("text_config") or cfg)


def _tensor_index(model_dir: Path) -> dict[str, Path]:
    """Tensor name → safetensors file of the checkpoint in ``model_dir``."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
        return {k: model_dir / v for k, v in wm.items()}
    out: dict[str, Path] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        h = _io.safetensors_header(f)
        if h is None:
            raise DataError(f"{f}: not a complete safetensors file")
        out.update({k: f for k in h if k != "__metadata__"})
    if not out:
        raise DataError(f"--target-model {model_dir}: no safetensors files")
    return out


def _pick(names: Sequence[str], exact: Sequence[str], suffix: str) -> str | None:
    for e in exact:
        if e in names:
            return e
    cands = sorted((n for n in names if n.endswith(suffix) and ".layers." not in n), key=len)
    return cands[0] if cands else None


@dataclass
class Target:
    """The frozen pieces of the target: embeddings, final norm, lm_head."""

    embed: torch.Tensor  # [V, H]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    eps: float
    config: dict[str, Any]
    path: Path

    @property
    def vocab(self) -> int:
        return self.lm_head.shape[0]

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        from .draft import rms_norm

        x = rms_norm(last.to(self.norm.dtype), self.norm, self.eps)
        return F.linear(x, self.lm_head)

    def embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed)


def load_target(model_dir: str | os.PathLike[str], device: torch.device, dtype: torch.dtype) -> Target:
    from safetensors import safe_open

    model_dir = Path(model_dir)
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        raise DataError(f"--target-model {model_dir}: no config.json (a local model directory is needed)") from None
    tc = text_config(cfg)
    where = _tensor_index(model_dir)
    names = list(where)
    embed_key = _pick(names, ["model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
                              "language_model.model.embed_tokens.weight"], "embed_tokens.weight")
    norm_key = _pick(names, ["model.norm.weight", "model.language_model.norm.weight",
                             "language_model.model.norm.weight"], "model.norm.weight")
    head_key = _pick(names, ["lm_head.weight", "language_model.lm_head.weight"], "lm_head.weight")
    if head_key is None and tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings")):
        head_key = embed_key
    missing = [n for n, k in (("embeddings", embed_key), ("final norm", norm_key), ("lm_head", head_key)) if k is None]
    if missing:
        raise DataError(f"--target-model {model_dir}: cannot find the {', '.join(missing)} tensor(s)")

    def get(key: str) -> torch.Tensor:
        with safe_open(str(where[key]), framework="pt", device="cpu") as f:
            return f.get_tensor(key)

    embed = get(embed_key)
    lm_head = embed if head_key == embed_key else get(head_key)
    return Target(embed=embed.to(device=device, dtype=dtype), norm=get(norm_key).to(device=device, dtype=dtype),
                  lm_head=lm_head.to(device=device, dtype=dtype), eps=float(tc.get("rms_norm_eps", 1e-6)),
                  config=cfg, path=model_dir)


def draft_config(target: Target, ds: Dataset, draft_vocab_size: int, args: argparse.Namespace) -> DraftConfig:
    tc = text_config(target.config)
    h = ds.hidden
    if target.embed.shape[1] != h:
        raise DataError(f"target embeddings have width {target.embed.shape[1]}, the hidden states {h}")
    shape = draft_shape.draft_shape(tc, h, args.num_heads, args.num_kv_heads)  # what is copied: see there
    if shape.warning:
        say(f"train warning: {shape.warning}")
    if shape.note:
        say(f"train note: {shape.note}")
    return DraftConfig(
        hidden_size=h,
        intermediate_size=args.intermediate_size or int(tc.get("intermediate_size") or 4 * h),
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim, vocab_size=int(tc.get("vocab_size") or target.vocab),
        draft_vocab_size=draft_vocab_size, aux_layer_ids=ds.layer_ids[:-1], rms_norm_eps=target.eps,
        rope_theta=shape.rope_theta, max_position_embeddings=int(tc.get("max_position_embeddings") or 2048),
        rope_scaling=shape.rope_scaling,
    )


# ------------------------------------------------------------------------------------------ the TTT

def ttt_forward(draft: Eagle3Draft, target: Target, batch: dict[str, torch.Tensor], steps: int,
                decay: float, device: torch.device, amp: torch.dtype | None,
                denoms: Sequence[float] | None = None, record: list[torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(total loss, per-step losses, per-step accuracies) of one batch; see the module docstring.

    ``denoms``: the loss-masked position count of each step over the whole global batch (several
    ranks); default: this batch's own (:func:`masked_counts`). ``record``: gets each step's per-position
    hits ``[B, m_i]`` (the draft's greedy proposal equals the target's argmax), for ``eagle3.heldout``."""
    aux = batch["aux"].to(device)
    last = batch["last"].to(device)
    ids = batch["ids"].to(device)
    mask = batch["mask"].to(device)
    t = ids.shape[1]
    dtype = torch.float32
    with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        with torch.no_grad():
            tl = target.logits(last if amp else last.to(target.norm.dtype))  # [B, T, V]
            targ_arg = tl.argmax(-1)  # [B, T]
            in_vocab = draft.t2d[targ_arg]
            tlogp = torch.log_softmax(tl[..., draft.t2d].float(), dim=-1)  # [B, T, Vd]
            del tl
        hidden = draft.project(aux if amp else aux.to(dtype))
        cache: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        losses, accs = [], []
        total = torch.zeros((), device=device)
        for i in range(steps):
            # position p < t-1-i: input token ids[p+1+i], target distribution at p+1+i,
            # predicted token p+2+i; positions past that are padding (attended only by themselves).
            n = max(t - 1 - i, 0)
            emb_ids = torch.zeros_like(ids)
            emb_ids[:, :n] = ids[:, 1 + i:1 + i + n]
            embeds = target.embeddings(emb_ids)
            if not amp:
                embeds = embeds.to(dtype)
            out = draft.step(embeds, hidden, cache, i)
            m = max(n - 1, 0)  # the predicted token p+2+i must exist
            logits = draft.logits(out[:, :m]).float()
            pm = mask[:, 2 + i:2 + i + m]  # loss mask of the predicted token
            tgt_logp = tlogp[:, 1 + i:1 + i + m]
            inv = in_vocab[:, 1 + i:1 + i + m]
            count = pm.sum().clamp_min(1) if denoms is None else max(float(denoms[i]), 1.0)
            logp = torch.log_softmax(logits, dim=-1)
            kl = (tgt_logp.exp() * (tgt_logp - logp)).sum(-1)  # [B, m]
            loss_i = (kl * (pm & inv)).sum() / count
            with torch.no_grad():
                hit = draft.to_target_ids(logits.argmax(-1)) == targ_arg[:, 1 + i:1 + i + m]
                acc_i = (hit & pm & inv).sum() / count
                if record is not None:
                    record.append(hit)
            losses.append(loss_i)
            accs.append(acc_i)
            total = total + (decay ** i) * loss_i
            hidden = out
    return total, losses, accs


def masked_counts(batch: dict[str, torch.Tensor], steps: int) -> torch.Tensor:
    """Loss-masked predicted positions of each TTT step (step i predicts tokens from index 2+i on)."""
    return torch.stack([batch["mask"][:, 2 + i:].sum() for i in range(steps)]).to(torch.float64)


@torch.no_grad()
def evaluate(draft: Eagle3Draft, target: Target, ds: Dataset, *, steps: int = 3, batch_size: int = 8,
             device: torch.device | str = "cpu", amp: torch.dtype | None = None) -> dict[str, list[float]]:
    """Token-weighted per-step loss and accuracy of ``draft`` over the whole data set."""
    device = torch.device(device)
    was = draft.training
    draft.eval()
    sums = [[0.0, 0.0] for _ in range(steps)]
    weights = [0.0] * steps
    for s in range(0, len(ds), batch_size):
        batch = ds.batch(range(s, min(len(ds), s + batch_size)))
        _, losses, accs = ttt_forward(draft, target, batch, steps, 1.0, device, amp)
        for i in range(steps):
            w = float(batch["mask"][:, 2 + i:].sum())
            sums[i][0] += float(losses[i]) * w
            sums[i][1] += float(accs[i]) * w
            weights[i] += w
    draft.train(was)
    return {"loss": [x[0] / max(w, 1.0) for x, w in zip(sums, weights, strict=True)],
            "acc": [x[1] / max(w, 1.0) for x, w in zip(sums, weights, strict=True)]}


# ----------------------------------------------------------------------------------------- the loop

def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        span = max(total - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


def rng_state(device: torch.device) -> dict[str, Any]:
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _py_rng_to_tensor(random.getstate())}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np

        _, keys, pos, has_gauss, cached = np.random.get_state()
        st["numpy"] = {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    except ImportError:
        pass
    return st


def _py_rng_to_tensor(state: tuple) -> dict[str, Any]:
    version, internal, gauss = state
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def set_rng_state(st: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    py = st["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)
    if "numpy" in st:
        try:
            import numpy as np

            n = st["numpy"]
            np.random.set_state(("MT19937", n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"],
                                 n["cached_gaussian"]))
        except ImportError:
            pass


def pick_device(name: str, world: _dist.World | None = None) -> torch.device:
    """The device; under torchrun ``cuda`` (or ``auto`` with CUDA) means this rank's GPU, cuda:LOCAL_RANK."""
    world = world or _dist.World()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name}: CUDA is not available in this interpreter ({sys.executable})")
    if name == "cuda" and world.distributed:
        return torch.device(f"cuda:{world.local_rank}")
    return torch.device(name)


def pick_amp(name: str, device: torch.device) -> torch.dtype | None:
    if name == "float32":
        return None
    if name == "bfloat16":
        return torch.bfloat16
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None


def _lock_out(out: Path) -> int:
    fd = os.open(out / ".train.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RuntimeError(f"another train process (pid {holder}) is writing to {out}; stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _hook(name: str) -> str | None:
    v = os.environ.get(name)
    return v if v not in (None, "") else None


def run_fingerprint(args: argparse.Namespace, ds: Dataset, cfg: DraftConfig, total: int) -> dict[str, Any]:
    """What must match for a relaunch to continue a run (and give the same weights)."""
    return {
        "data": ds.manifest.get("fingerprint") or {"num_samples": ds.manifest.get("num_samples")},
        "samples": ds.indices, "max_len": args.max_len, "draft": cfg.to_dict(), "seed": args.seed,
        "batch_size": args.batch_size, "total_steps": total, "lr": args.lr, "warmup_steps": args.warmup_steps,
        "min_lr_ratio": args.min_lr_ratio, "weight_decay": args.weight_decay, "grad_clip": args.grad_clip,
        "ttt_steps": args.ttt_steps, "ttt_decay": args.ttt_decay,
        # Only where it is not the default, so that checkpoints of earlier runs still resume. Streaming reads the
        # index order too: a run may go on with or without the budget.
        **({"order": "index"} if args.order != "shuffled" else {}),
    }


def _extraction_status(root: Path) -> str | None:
    try:
        return str(json.loads((root / "manifest.json").read_text()).get("status"))
    except (OSError, ValueError):
        return None


def export_draft(out: Path, draft: Eagle3Draft, info: dict[str, Any]) -> None:
    tensors = export_tensors(draft)
    _io.atomic_save_safetensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    cfg = draft.cfg.vllm_config()
    _io.atomic_write_json(cfg, out / "config.json")
    _io.atomic_write_json(info, out / "train_info.json")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m eagle3.train", description="EAGLE-3 draft training (resumable).")
    ap.add_argument("--data", required=True, help="output directory of eagle3.extract")
    ap.add_argument("--out", required=True, help="where the draft, checkpoints and train_info.json go")
    ap.add_argument("--target-model", help="target model directory (default: the manifest's model; needed "
                                           "for speculators' own data, which has no manifest)")
    ap.add_argument("--layer-ids", help="layer ids the hidden states hold, comma-separated, vLLM numbering "
                                        "(default: the manifest's; speculators' own data stores none)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default %(default)s)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="compute dtype: auto = bf16 autocast on CUDA, fp32 on the CPU")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--max-steps", type=int, help="train this many steps (overrides --epochs)")
    ap.add_argument("--batch-size", type=int, default=4,
                    help="samples per step, over all processes (under torchrun each rank takes its share)")
    ap.add_argument("--max-len", type=int, default=2048, help="samples are cut to this many tokens")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, help="linear warmup steps (default: 5%% of the steps)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr × this")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=0.5)
    ap.add_argument("--ttt-steps", type=int, default=3, help="training-time test steps")
    ap.add_argument("--ttt-decay", type=float, default=0.8, help="weight of step i is decay**i")
    ap.add_argument("--draft-vocab", type=int, default=32000,
                    help="draft vocabulary: the most frequent target tokens (capped at the target's vocabulary)")
    ap.add_argument("--intermediate-size", type=int, help="draft MLP width (default: the target's)")
    ap.add_argument("--num-heads", type=int, help="draft attention heads (default: the target's; hidden/128 for MLA)")
    ap.add_argument("--num-kv-heads", type=int, help="draft key/value heads (default: the target's; 8 for MLA)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for torch (default 0: torch's own choice; 1 is often faster on a busy CPU)")
    ap.add_argument("--order", choices=("shuffled", "index", "stream"), default="shuffled",
                    help="reading order: shuffled (seeded, every epoch), index (sample 0, 1, ...), or stream: index "
                         "order while eagle3.extract --disk-budget writes --data, one epoch, each sample released "
                         "(deleted) once a checkpoint holds it (eagle3.budget)")
    ap.add_argument("--wait-report-s", default=str(budget.REPORT_S), metavar="S",
                    help="--order stream: while waiting for a sample, say so every S seconds (default %(default)s; "
                         "keep it under the supervisor's stall floor and silence_s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--keep", type=int, default=3, help="checkpoints kept")
    args = ap.parse_args(argv)
    if args.threads < 0:
        ap.error("--threads must not be negative")
    try:
        args.wait_report_s = budget.parse_report_s(args.wait_report_s)
    except ValueError as e:
        ap.error(str(e))
    for name in ("epochs", "batch_size", "max_len", "ttt_steps", "draft_vocab", "log_every", "save_every", "keep"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.max_steps is not None and args.max_steps < 1:
        ap.error("--max-steps must be positive")
    if args.order == "stream" and (args.epochs != 1 or args.max_steps is not None):
        # Fewer steps would leave samples nobody consumes, and extraction paused on them for good.
        ap.error("--order stream trains exactly one epoch (each sample is deleted once read): give --epochs 1 and "
                 "no --max-steps; more epochs need every sample kept (--order index on a complete extraction)")
    return args


@dataclass
class Setup:
    """Everything a run needs before its first step (also used by tests and the benchmark)."""

    ds: Dataset
    target: Target
    cfg: DraftConfig
    draft: Eagle3Draft  # freshly initialised from --seed, with d2t/t2d set
    freq: torch.Tensor
    device: torch.device
    amp: torch.dtype | None
    model_dir: str
    steps_per_epoch: int
    total: int

    @property
    def coverage(self) -> float:
        """Share of the loss-masked tokens that lie in the draft vocabulary."""
        return float(self.freq[self.draft.t2d.cpu()].sum()) / max(float(self.freq.sum()), 1.0)


def setup(args: argparse.Namespace, world: _dist.World | None = None) -> Setup:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device, world)
    amp = pick_amp(args.dtype, device)
    ds = open_dataset(args.data, args.max_len, args.layer_ids, stream=args.order == "stream",
                      report_s=args.wait_report_s)
    model_dir = args.target_model or ds.manifest.get("model")
    if not model_dir:
        raise DataError(f"--data {args.data}: no manifest names the target model; pass --target-model")
    target = load_target(model_dir, device, torch.bfloat16 if amp else torch.float32)
    freq = token_frequencies(Path(args.data), target.vocab, ds)
    k = min(args.draft_vocab, target.vocab)
    d2t, t2d = draft_vocab(freq, k)
    cfg = draft_config(target, ds, k, args)
    per_epoch = math.ceil(len(ds) / args.batch_size)
    total = per_epoch * args.epochs if args.max_steps is None else args.max_steps
    if args.warmup_steps is None:
        args.warmup_steps = max(1, total // 20)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    draft = Eagle3Draft(cfg, n_aux=len(ds.aux_pos))
    draft.set_vocab(d2t, t2d)
    draft.to(device)
    return Setup(ds, target, cfg, draft, freq, device, amp, str(model_dir), per_epoch, total)


def train(args: argparse.Namespace) -> Path:
    """Train (or resume) as ``args`` say; returns the output directory. Under torchrun every rank
    calls this; rank 0 alone locks, cleans, writes checkpoints and exports."""
    out = Path(args.out)
    world = _dist.from_env()
    out.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_out(out) if world.main else None
    try:
        return _train(args, out, world)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
        _dist.stop(world)


def _resume_state(store: Checkpoints, world: _dist.World) -> tuple[dict[str, Any], Path] | None:
    """Rank 0 picks the newest usable checkpoint (setting damaged ones aside); the others load that one."""
    loaded = store.load_latest(map_location="cpu") if world.main else None
    chosen = _dist.broadcast(str(loaded[1]) if loaded else None, world)
    if world.main or chosen is None:
        return loaded
    return torch.load(Path(chosen) / "state.pt", map_location="cpu", weights_only=True), Path(chosen)


def _train(args: argparse.Namespace, out: Path, world: _dist.World) -> Path:
    t_start = time.monotonic()
    say("train phase: model_init")
    store = Checkpoints(out / "checkpoints", keep=args.keep, say=say)
    if world.main:
        _io.remove_temp_files(out)
        store.clean_leftovers()

    su = setup(args, world)
    _dist.start(world, su.device)
    ds, target, draft, device, amp, total = su.ds, su.target, su.draft, su.device, su.amp, su.total
    fingerprint = run_fingerprint(args, ds, su.cfg, total)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, args.warmup_steps, args.min_lr_ratio))
    step, epoch, index = 0, 0, 0

    loaded = _resume_state(store, world)
    if loaded is not None:
        state, path = loaded
        diff = [key for key in fingerprint if json.dumps(state["run"].get(key), sort_keys=True, default=str)
                != json.dumps(fingerprint[key], sort_keys=True, default=str)]
        if diff:
            raise OutputMismatch(f"{out} holds checkpoints of a run with other settings (differs in: "
                                 f"{', '.join(diff)}); use a new --out, or remove {store.root} to start over")
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, index = int(state["step"]), int(state["data"]["epoch"]), int(state["data"]["index"])
        set_rng_state(state["rng"], device)
        say(f"train resumed from step {step} ({path})")
    stream = args.order == "stream"
    if stream and world.main:
        ledger = budget.sweep(ds.root, ds.path)
        at = len(ds) if epoch else index
        if ledger.through > at:
            raise DataError(f"{budget.Ledger.path(ds.root)}: samples up to {ledger.through} were consumed and "
                            f"deleted, but the checkpoint resumed reads from sample {at}: the newer checkpoint "
                            "that held them is gone; the pipeline must start over in new directories")

    say(f"train config: {len(ds)} samples, {su.steps_per_epoch} steps/epoch, {total} steps, draft vocab "
        f"{su.cfg.draft_vocab_size} of {target.vocab} (covers {su.coverage:.1%} of the loss-masked tokens), "
        f"aux layers {su.cfg.aux_layer_ids}, device {device}, {'bf16 autocast' if amp else 'fp32'}, "
        f"{world.size} process(es)")
    say("train phase: training")

    nan_at = _hook("EAGLE3_TRAIN_INJECT_NAN_AT")
    delay = float(_hook("EAGLE3_TRAIN_STEP_DELAY_S") or 0)
    draft.train()
    steps = args.ttt_steps
    window = _Window(steps)
    perm = permutation(len(ds), args.seed, epoch, args.order)

    def checkpoint() -> None:
        if not world.main:
            return
        state = {"step": step, "data": {"epoch": epoch, "index": index}, "model": draft.state_dict(),
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": rng_state(device),
                 "run": fingerprint}
        path = store.save(step, state)
        say(f"train checkpoint saved: step {step} path {path}")
        if stream:  # what the saved checkpoint has read is never read again: its files go
            ledger = budget.release(ds.root, len(ds) if epoch else index, ds.path)
            say(f"train released: samples 0..{ledger.through - 1} consumed ({ledger.released_bytes} bytes freed)")

    def await_samples(chosen: list[int]) -> None:
        """--order stream: wait until extraction has written every sample of the batch. Where extraction is
        paused on its disk budget, what was read so far is checkpointed and released first, then the sample
        asked for, so that neither side waits on the other for good."""
        nonlocal last_saved
        missing = [ds.indices[j] for j in chosen if ds.reader.header(ds.indices[j]) is None]
        if not missing:
            return
        wait = budget.Waiting(say, args.wait_report_s)
        asked = False
        t_check = time.monotonic()
        while missing:
            # Said again while it lasts: the supervisor takes a silent wait for a stall (budget.REPORT_S).
            wait.tick(lambda secs, i=missing[0]: (
                f"train waiting: sample {i} not extracted yet (extraction paused or behind; {secs:.0f}s)"))
            if world.main and not asked and budget.paused(ds.root):
                if step != last_saved:
                    checkpoint()
                    last_saved = step
                budget.want(ds.root, missing[0])
                asked = True
            time.sleep(budget.POLL_S)
            missing = [i for i in missing if ds.reader.header(i) is None]
            if missing and time.monotonic() - t_check > 1.0:
                t_check = time.monotonic()
                status = _extraction_status(ds.root)
                if status not in ("running", None) and ds.reader.header(missing[0]) is None:
                    raise DataError(f"--data {ds.root}: the extraction ended ({status}) without sample "
                                    f"{missing[0]}; relaunch it, then this job")
        if asked:
            budget.want(ds.root, None)
        say(f"train waited {wait.waited_s:.1f}s for its samples")

    last_saved = step if loaded is not None else -1
    first_step = step
    while step < total:
        chosen = perm[index:index + args.batch_size]
        if stream:
            await_samples(chosen)
        mine = chosen[world.rank::world.size]
        weight = 1.0 if mine else 0.0  # a rank without a sample (a short last batch) adds nothing
        batch = ds.batch(mine or chosen[:1])
        denoms = _dist.all_sum(masked_counts(batch, steps) * weight, world)
        loss, losses, accs = ttt_forward(draft, target, batch, steps, args.ttt_decay, device, amp, denoms.tolist())
        if nan_at is not None and step + 1 == int(nan_at):
            loss = loss * float("nan")
        # Each rank's loss is its share of the global batch's; their sum is the global loss.
        stats = _dist.all_sum(torch.stack([loss.detach(), *[x.detach() for x in losses], *accs]).double().cpu()
                              * weight, world)
        if not bool(torch.isfinite(stats[0])):
            say(f"train loss is not finite at step {step + 1}")
            raise FloatingPointError(f"training loss is {float(stats[0])} at step {step + 1} "
                                     f"(lr {sched.get_last_lr()[0]:.3g})")
        opt.zero_grad(set_to_none=True)
        (loss * weight).backward()
        _dist.sum_grads(params, world)
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        sched.step()
        step += 1
        index += len(chosen)
        if index >= len(ds):
            epoch, index = epoch + 1, 0
            perm = permutation(len(ds), args.seed, epoch, args.order)
        tokens = _dist.all_sum(batch["lengths"].sum() * int(weight), world)
        window.add(stats[0], list(stats[1:1 + steps]), list(stats[1 + steps:]), int(tokens))
        if step % args.log_every == 0 or step == total or step == first_step + 1:
            say(f"train step {step}/{total} {window.line()}")
            window = _Window(steps)
        if step % args.save_every == 0 or step == total:
            checkpoint()
            last_saved = step
        if delay:
            time.sleep(delay)

    if last_saved != step:
        checkpoint()
    if world.main:
        info = {"format": INFO_FORMAT, "steps": step, "data": str(Path(args.data).resolve()),
                "target_model": str(Path(su.model_dir).resolve()), "draft_vocab_coverage": su.coverage,
                "run": {k: v for k, v in fingerprint.items() if k != "samples"},
                "seconds": round(time.monotonic() - t_start, 1)}
        export_draft(out, draft, info)
        say(f"train done: {step} steps")
    # Every rank leaves together: a rank that tore its process group down while rank 0 still wrote
    # the export was seen to abort in gloo ("terminate called without an active exception", -6).
    _dist.barrier(world)
    return out


class _Window:
    """Averages of the steps since the last progress line."""

    def __init__(self, steps: int):
        self.n = 0
        self.loss = 0.0
        self.losses = [0.0] * steps
        self.accs = [0.0] * steps
        self.tokens = 0
        self.t0 = time.monotonic()

    def add(self, loss: torch.Tensor, losses: list[torch.Tensor], accs: list[torch.Tensor], tokens: int) -> None:
        self.n += 1
        self.loss += float(loss.detach())
        for i, (lo, ac) in enumerate(zip(losses, accs, strict=True)):
            self.losses[i] += float(lo.detach())
            self.accs[i] += float(ac)
        self.tokens += tokens

    def line(self) -> str:
        n = max(self.n, 1)
        tps = self.tokens / max(time.monotonic() - self.t0, 1e-9)
        extra = "".join(f" loss_{i}={lo / n:.4f} acc_{i}={ac / n:.3f}" for i, (lo, ac) in
                        enumerate(zip(self.losses, self.accs, strict=True)))
        return f"loss={self.loss / n:.4f} acc0={self.accs[0] / n:.3f} tok/s={tps:.1f}{extra}"


def load_exported(out: str | os.PathLike[str], device: torch.device | str = "cpu") -> Eagle3Draft:
    """The draft saved in ``out`` (``config.json`` + ``model.safetensors``), in fp32."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(out) / "config.json").read_text())
    tensors = load_file(str(Path(out) / "model.safetensors"))
    draft = Eagle3Draft(DraftConfig.from_vllm_config(cfg), n_aux=tensors["fc.weight"].shape[1] // cfg["hidden_size"])
    draft.load_state_dict({k: (v if k in ("d2t", "t2d") else v.float()) for k, v in tensors.items()})
    return draft.to(device)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
