"""On-disk layouts of the extracted hidden states: ours, speculators' (0.9) and SpecForge's (0.2).

Every layout holds, per sample ``i``, the captured layers (ascending layer ids in vLLM numbering, the
last one L: the last decoder layer's output before the final norm), the token ids and the loss mask.

* ``supervise`` (ours): ``hs_{i}.safetensors`` with ``hidden_states`` bf16 ``[T, n_layers, H]``,
  ``token_ids`` int64 ``[T]``, ``loss_mask`` uint8 ``[T]``; ``token_freq.safetensors``. A sample file
  may lack ``loss_mask`` (a vLLM staged file renamed into place as it is): its mask is then sample
  ``i``'s span of ``prepared.safetensors``, which such an output always has.
* ``speculators`` (what ``speculators.train.data.ArrowDataset`` reads): the directory is a
  ``datasets.save_to_disk`` dataset with columns ``input_ids``, ``loss_mask``, ``seq_len`` (torch
  format), ``hidden_states/hs_{i}.safetensors`` (``hidden_states`` ``[T, n_layers, H]``, ``token_ids``;
  speculators splits the last layer off as the verifier's and applies the verifier's norm itself),
  and ``token_freq.pt`` (``torch.save`` of ``{token id: count}`` over loss-masked tokens, as
  ``speculators.train.vocab_mapping.save_token_frequency_distribution`` writes it). Row ``i`` of the
  dataset is sample ``i``. Writing or reading the dataset needs the ``datasets`` package.
* ``specforge`` (what SpecForge 0.2's ``OfflineEagle3Dataset`` reads): ``rows_{a}-{b}/data_{i}.ckpt``
  (groups of 2000), each a ``torch.save`` of ``input_ids`` int64 ``[T]``, ``loss_mask`` int64 ``[T]``,
  ``aux_hidden_state`` bf16 ``[1, T, 3H]`` (the three auxiliary layers concatenated) and
  ``hidden_state`` bf16 ``[1, T, H]``: layer L **after** the target's final RMSNorm (its weight is read
  from the model directory). No layer ids are stored, and the pre-norm state cannot be recovered, so
  this layout is written, never read back for training.

Every file is written to a temporary name and renamed (:mod:`._io`), so a sample exists only when
complete; a relaunch skips the samples that exist. A complete file that already holds what a layout
reads (:meth:`Writer.adopt`) is renamed or hard-linked into place instead of being written again.
"""

from __future__ import annotations

import enum
import io
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _io

SPECFORGE_GROUP = 2000  # SpecForge's prepare_hidden_states.py default file_group_size
DATASET_FILES = ("data-00000-of-00001.arrow", "dataset_info.json", "state.json")


class Format(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+; a job may run under vLLM's older interpreter
    SUPERVISE = "supervise"
    SPECULATORS = "speculators"
    SPECFORGE = "specforge"


class FormatError(ValueError):
    """The layout cannot be written or read as asked (one line says what to do)."""


@dataclass
class SampleData:
    hidden_states: Any  # torch bf16 [T, n_layers, H]
    token_ids: Any  # int64 [T]
    loss_mask: Any  # [T]


@dataclass
class FinalNorm:
    """The target's final RMSNorm (for SpecForge's post-norm ``hidden_state``)."""

    weight: Any  # fp32 [H]
    eps: float

    def __call__(self, h: Any) -> Any:
        import torch

        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(torch.bfloat16)


def require_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise FormatError(f"{what} needs the 'datasets' package in this interpreter: pip install datasets") from None
    return datasets


def read_final_norm(model_dir: str | os.PathLike[str]) -> FinalNorm:
    """The final norm's weight and eps from a local model directory, or FormatError in one line."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        raise FormatError(f"--format specforge needs the target's final-norm weight: {model_dir} has no readable "
                          "config.json (pass --model DIR, the target's local model directory)") from None
    tc = cfg if "num_hidden_layers" in cfg else (cfg.get("text_config") or cfg)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        where = {k: model_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    else:
        where = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            h = _io.safetensors_header(f) or {}
            where.update({k: f for k in h if k != "__metadata__"})
    names = sorted((n for n in where if n.endswith("norm.weight") and ".layers." not in n
                    and "embed" not in n), key=lambda n: (n != "model.norm.weight", len(n)))
    if not names:
        raise FormatError(f"--format specforge needs the target's final-norm weight, and {model_dir} has none "
                          "(no *norm.weight outside the layers in its safetensors files)")
    with safe_open(str(where[names[0]]), framework="pt", device="cpu") as f:
        weight = f.get_tensor(names[0]).float()
    return FinalNorm(weight, float(tc.get("rms_norm_eps", 1e-6)))


# ------------------------------------------------------------------------------------------ writing

class Writer:
    """Per-sample files of one layout under ``root`` (the base: ours)."""

    fmt = Format.SUPERVISE
    loss_mask_keys: tuple[str, ...] = ("", "loss_mask")  # "": a file without one (see masks_elsewhere)

    def __init__(self, root: Path, layer_ids: Sequence[int], num_layers: int, hidden: int):
        self.root = Path(root)
        self.layer_ids = list(layer_ids)
        self.num_layers = num_layers
        self.hidden = hidden
        # True when the output's prepared.safetensors holds every sample's loss mask (an extraction,
        # whose shards each write the whole set's for gather; an export): sample files may then lack one.
        self.masks_elsewhere = False

    def adoptable(self, h: dict[str, Any]) -> bool:
        """Whether a complete sample file with safetensors header ``h`` is already in this layout."""
        keys = set(h) - {"__metadata__"}
        hs, ids = h.get("hidden_states") or {}, h.get("token_ids") or {}
        shape = hs.get("shape") or [0, 0, 0]
        if hs.get("dtype") != "BF16" or ids.get("dtype") != "I64" or len(shape) != 3 \
                or shape[1:] != [len(self.layer_ids), self.hidden] or ids.get("shape") != shape[:1]:
            return False
        if keys == {"hidden_states", "token_ids"}:
            return "" in self.loss_mask_keys and (self.masks_elsewhere or self.fmt is not Format.SUPERVISE)
        mask = h.get("loss_mask") or {}
        return (keys == {"hidden_states", "token_ids", "loss_mask"} and "loss_mask" in self.loss_mask_keys
                and mask.get("dtype") == "U8" and mask.get("shape") == shape[:1])

    def adopt(self, i: int, src: Path, header: dict[str, Any], *, move: bool) -> str | None:
        """Put the complete file ``src`` in place as sample ``i`` without writing it again, if it is
        already in this layout: renamed (``move``) or hard-linked, copied where neither can be done.
        Returns how, or None when the sample must be rewritten (:meth:`write`)."""
        if not self.adoptable(header):
            return None
        self.path(i).parent.mkdir(parents=True, exist_ok=True)
        return _io.place_file(src, self.path(i), move=move, sample=True)

    def path(self, i: int) -> Path:
        return self.root / f"hs_{i}.safetensors"

    def files(self) -> dict[str, str]:
        return {"sample": "hs_{i}.safetensors", "token_freq": "token_freq.safetensors"}

    def clean(self) -> list[Path]:
        """Remove temporaries of a killed run (in every directory this layout writes)."""
        removed = _io.remove_temp_files(self.root)
        for d in self.root.glob("*/"):
            if d.name.startswith(("hidden_states", "rows_")):
                removed += _io.remove_temp_files(d)
            elif d.name.startswith(f".dataset{_io.TMP_MARK}") and _io.writer_gone(d):  # a save killed half-way
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        return removed

    def complete(self, i: int, seq_len: int) -> bool:
        return _io.sample_file_ok(self.path(i), seq_len, len(self.layer_ids), self.hidden)

    def write(self, i: int, s: SampleData) -> None:
        import torch

        self.path(i).parent.mkdir(parents=True, exist_ok=True)
        _io.atomic_save_safetensors({
            "hidden_states": s.hidden_states.to(torch.bfloat16),
            "token_ids": s.token_ids.to(torch.int64),
            "loss_mask": s.loss_mask.to(torch.uint8),
        }, self.path(i), sample=True)

    def write_dataset(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
                      masked_freq: Any) -> None:
        """The files that describe the whole set (known before any hidden state)."""


class SpeculatorsWriter(Writer):
    fmt = Format.SPECULATORS

    def __init__(self, root: Path, layer_ids: Sequence[int], num_layers: int, hidden: int):
        super().__init__(root, layer_ids, num_layers, hidden)
        require_datasets("--format speculators")

    def path(self, i: int) -> Path:
        return self.root / "hidden_states" / f"hs_{i}.safetensors"

    def files(self) -> dict[str, str]:
        return {"sample": "hidden_states/hs_{i}.safetensors", "token_freq": "token_freq.pt",
                "dataset": "datasets.save_to_disk (input_ids, loss_mask, seq_len)"}

    def write_dataset(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
                      masked_freq: Any) -> None:
        import torch

        datasets = require_datasets("--format speculators")
        ds = datasets.Dataset.from_dict({
            "input_ids": [list(map(int, t)) for t in token_ids],
            "loss_mask": [list(map(int, m)) for m in loss_masks],
            "seq_len": [len(t) for t in token_ids],
        }, features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                       "loss_mask": datasets.Sequence(datasets.Value("int64")),
                                       "seq_len": datasets.Value("int64")}))
        ds.set_format(type="torch")
        tmp = self.root / f".dataset{_io.TMP_MARK}{_io.temp_tag()}"
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp), num_shards=1)
        # state.json last: load_from_disk needs it, so a kill before it leaves no half dataset in use.
        for name in DATASET_FILES:
            os.replace(tmp / name, self.root / name)
        _io.fsync_path(self.root)
        shutil.rmtree(tmp, ignore_errors=True)
        counts = {int(k): int(c) for k, c in enumerate(masked_freq.tolist()) if c}
        buf = io.BytesIO()
        torch.save(counts, buf)
        _io.atomic_write_bytes(buf.getvalue(), self.root / "token_freq.pt")


class SpecForgeWriter(Writer):
    fmt = Format.SPECFORGE
    loss_mask_keys = ()  # another file format altogether: always rewritten

    def __init__(self, root: Path, layer_ids: Sequence[int], num_layers: int, hidden: int, norm: FinalNorm):
        super().__init__(root, layer_ids, num_layers, hidden)
        if len(self.layer_ids) != 4 or self.layer_ids[-1] != num_layers:
            raise FormatError(f"--format specforge stores 3 auxiliary layers and the last layer {num_layers}; "
                              f"layer ids {self.layer_ids} are not that shape (use the default --layer-ids)")
        if norm.weight.shape[0] != hidden:
            raise FormatError(f"the final-norm weight has {norm.weight.shape[0]} entries, the hidden size is {hidden}")
        self.norm = norm

    def path(self, i: int) -> Path:
        a = i // SPECFORGE_GROUP * SPECFORGE_GROUP
        return self.root / f"rows_{a}-{a + SPECFORGE_GROUP}" / f"data_{i}.ckpt"

    def files(self) -> dict[str, str]:
        return {"sample": "rows_{a}-{b}/data_{i}.ckpt", "token_freq": "token_freq.safetensors"}

    def complete(self, i: int, seq_len: int) -> bool:
        # Written by rename only: present means complete.
        return self.path(i).is_file()

    def write(self, i: int, s: SampleData) -> None:
        import torch

        hs = s.hidden_states
        aux = hs[:, :3].flatten(1).to(torch.bfloat16)
        data = {"input_ids": s.token_ids.to(torch.int64).clone(), "loss_mask": s.loss_mask.to(torch.int64).clone(),
                "hidden_state": self.norm(hs[:, 3])[None].contiguous(), "aux_hidden_state": aux[None].contiguous()}
        buf = io.BytesIO()
        torch.save(data, buf)
        self.path(i).parent.mkdir(parents=True, exist_ok=True)
        _io.atomic_write_bytes(buf.getvalue(), self.path(i), sample=True)


def make_writer(fmt: Format, root: Path, layer_ids: Sequence[int], num_layers: int, hidden: int,
                model_dir: str | os.PathLike[str] | None) -> Writer:
    if fmt is Format.SPECULATORS:
        return SpeculatorsWriter(root, layer_ids, num_layers, hidden)
    if fmt is Format.SPECFORGE:
        if not model_dir:
            raise FormatError("--format specforge needs the target's final-norm weight: pass --model DIR "
                              "(the target's local model directory)")
        return SpecForgeWriter(root, layer_ids, num_layers, hidden, read_final_norm(model_dir))
    return Writer(root, layer_ids, num_layers, hidden)


# ------------------------------------------------------------------------------------------ reading

def detect(root: Path) -> Format:
    """The layout of an output directory (the manifest's word first, then the files)."""
    try:
        fmt = json.loads((root / "manifest.json").read_text()).get("output_format")
        if fmt:
            return Format(fmt)
    except (OSError, ValueError):
        pass
    if (root / "hidden_states").is_dir() and (root / "state.json").is_file():
        return Format.SPECULATORS
    if any(root.glob("rows_*/data_*.ckpt")):
        return Format.SPECFORGE
    return Format.SUPERVISE


class Reader:
    """The samples of an output directory in ours or speculators' layout."""

    def __init__(self, root: Path, fmt: Format):
        if fmt is Format.SPECFORGE:
            raise FormatError(f"{root} is in SpecForge's layout, which keeps layer L only after the final norm: "
                              "train on (or export from) the supervise or speculators output instead")
        self.root = Path(root)
        self.fmt = fmt
        self._rows: Any = None
        self._masks: Any = None  # prepared.safetensors' loss masks and offsets, read when first needed
        if fmt is Format.SPECULATORS:
            datasets = require_datasets(f"reading {root} (speculators' layout)")
            try:
                self._rows = datasets.load_from_disk(str(root)).with_format("torch")
            except FileNotFoundError:
                raise FormatError(f"{root} has hidden_states/ but no dataset (state.json): "
                                  "it is not a speculators data directory") from None

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else 0

    def path(self, i: int) -> Path:
        if self.fmt is Format.SPECULATORS:
            return self.root / "hidden_states" / f"hs_{i}.safetensors"
        return self.root / f"hs_{i}.safetensors"

    def header(self, i: int) -> dict[str, Any] | None:
        h = _io.safetensors_header(self.path(i))
        return h if h is not None and "hidden_states" in h and "token_ids" in h else None

    def load(self, i: int) -> SampleData:
        import torch
        from safetensors.torch import load_file

        d = load_file(str(self.path(i)))
        if self._rows is not None:
            row = self._rows[i]
            if not torch.equal(row["input_ids"].to(torch.int64), d["token_ids"].to(torch.int64)):
                raise FormatError(f"{self.path(i)}: token_ids differ from row {i} of the dataset in {self.root}")
            mask = row["loss_mask"]
        elif "loss_mask" in d:
            mask = d["loss_mask"]
        else:
            mask = self.prepared_mask(i)
        return SampleData(d["hidden_states"], d["token_ids"].to(torch.int64), mask)

    def prepared_mask(self, i: int) -> Any:
        """Sample ``i``'s loss mask from ``prepared.safetensors`` (for sample files without one)."""
        from safetensors.torch import load_file

        if self._masks is None:
            p = self.root / "prepared.safetensors"
            if not p.is_file():
                raise FormatError(f"{self.path(i)} has no loss_mask and {self.root} has no prepared.safetensors "
                                  "to take it from")
            d = load_file(str(p))
            self._masks = (d["loss_mask"], d["offsets"].tolist())
        mask, off = self._masks
        return mask[off[i]:off[i + 1]]

    def token_freq(self) -> dict[int, int] | None:
        """speculators' ``token_freq.pt`` if there is one."""
        import torch

        p = self.root / "token_freq.pt"
        return {int(k): int(v) for k, v in torch.load(p, weights_only=True).items()} if p.is_file() else None
