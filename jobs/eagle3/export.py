"""Convert an extraction output to another layout without recomputing:
``PYTHONPATH=jobs python -m eagle3.export SRC DST --format supervise|speculators|specforge [--model DIR]``.

``SRC`` is an ``eagle3.extract`` output in our or speculators' layout (with its ``manifest.json``);
``DST`` gets the same samples in the layout asked for (see :mod:`.formats`) and a ``manifest.json``
that records it (``output_format``, ``exported_from``). SpecForge's post-norm ``hidden_state`` needs
the target's final-norm weight: it is read from ``--model`` (default: the manifest's ``model``), and
the export refuses in one line without it (exit code 78). SpecForge's files store no layer ids: the
draft config SpecForge trains with must name the 3 auxiliary layers in SGLang's numbering, one lower
than ours (see :mod:`.draft_export`); the manifest records them as ``sglang_aux_layer_ids`` and an
``export note:`` line prints them.

A sample file that already is what the new layout reads (ours to ours, speculators' to ours, ours
written by the vLLM backend to speculators') is hard-linked, not copied: no byte is written for it.
Where linking is refused (another filesystem, a filesystem without links) it is copied as it is; the
rest (SpecForge's layout, files that must gain or lose a tensor) is rewritten. ``prepared.safetensors``
and ``token_freq.safetensors`` are linked the same way. Sample files are never modified in place, so
the two outputs sharing them is safe; ``export files`` says how many were linked, copied, rewritten.

Like the extraction it is resumable and atomic: each file is written to a temporary name and renamed,
a relaunch skips the samples already in ``DST``, and an export from another source or into another
layout is refused. A sample missing in ``SRC`` (an incomplete extraction) is skipped and reported;
the manifest then says ``incomplete`` and the exit code is 3.

Lines: ``export progress: {done}/{total} samples``,
``export files: {linked} linked, {copied} copied, {rewritten} rewritten``, ``export done: {n} samples in {secs:.1f}s``,
``export error: ...`` (one line, then exit code 78 or 75 for a full disk).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _io, draft_export, formats

EXIT_INCOMPLETE = 3
EXIT_DISK_FULL = 75
EXIT_CONFIG = 78


def say(line: str) -> None:
    print(line, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m eagle3.export",
                                 description="Convert an eagle3.extract output to another layout (no recomputing).")
    ap.add_argument("src", help="an eagle3.extract output directory (supervise or speculators layout)")
    ap.add_argument("dst", help="the directory to write")
    ap.add_argument("--format", required=True, choices=[f.value for f in formats.Format])
    ap.add_argument("--model", help="the target's local model directory (default: the manifest's model); "
                                    "specforge needs its final-norm weight")
    ap.add_argument("--progress-every", type=int, default=100, help="a progress line every N samples")
    args = ap.parse_args(argv)
    args.format = formats.Format(args.format)
    return args


def _lock(dst: Path) -> int:
    fd = os.open(dst / ".export.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise formats.FormatError(f"another export is writing to {dst}; stop it before relaunching") from None
    return fd


def _token_lists(src: Path, reader: formats.Reader, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every sample's token ids and loss mask: from prepared.safetensors when there, else the samples."""
    from safetensors.torch import load_file

    prepared = src / "prepared.safetensors"
    if prepared.is_file():
        p = load_file(str(prepared))
        off = p["offsets"].tolist()
        ids, mask = p["token_ids"].tolist(), p["loss_mask"].tolist()
        return [ids[off[i]:off[i + 1]] for i in range(n)], [mask[off[i]:off[i + 1]] for i in range(n)]
    samples = [reader.load(i) for i in range(n)]
    return [s.token_ids.tolist() for s in samples], [s.loss_mask.tolist() for s in samples]


def _masked_freq(src: Path, token_ids: list[list[int]], masks: list[list[int]], vocab: int) -> Any:
    import torch
    from safetensors.torch import load_file

    st = src / "token_freq.safetensors"
    if st.is_file():
        return load_file(str(st))["token_freq"]
    freq = torch.zeros(vocab, dtype=torch.int64)
    for ids, m in zip(token_ids, masks, strict=True):
        t = torch.tensor(ids, dtype=torch.int64)[torch.tensor(m, dtype=torch.bool)]
        freq += torch.bincount(t, minlength=vocab)[:vocab]
    return freq


def export(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    src, dst = Path(args.src), Path(args.dst)
    try:
        manifest = json.loads((src / "manifest.json").read_text())
    except (OSError, ValueError):
        raise formats.FormatError(f"{src} has no readable manifest.json: export reads eagle3.extract outputs") from None
    if src.resolve() == dst.resolve():
        raise formats.FormatError("SRC and DST are the same directory: export into a new one")
    reader = formats.Reader(src, formats.detect(src))
    layer_ids = [int(k) for k in manifest["layer_ids"]]
    num_layers, hidden, n = int(manifest["num_hidden_layers"]), int(manifest["hidden_size"]), int(manifest["num_samples"])
    dst.mkdir(parents=True, exist_ok=True)
    fd = _lock(dst)
    try:
        return _export_locked(args, src, dst, manifest, reader, layer_ids, num_layers, hidden, n, t0)
    finally:
        os.close(fd)


def _export_locked(args: argparse.Namespace, src: Path, dst: Path, manifest: dict[str, Any], reader: formats.Reader,
                   layer_ids: list[int], num_layers: int, hidden: int, n: int, t0: float) -> int:
    origin = {"exported_from": str(src.resolve()), "output_format": args.format.value,
              "fingerprint": manifest.get("fingerprint")}
    try:
        old = json.loads((dst / "manifest.json").read_text())
        diff = [k for k, v in origin.items() if old.get(k) != v]
        if diff:
            raise formats.FormatError(f"{dst} holds an export with other settings (differs in: {', '.join(diff)}); "
                                      "use a new DST, or remove it to redo the export")
    except FileNotFoundError:
        pass
    writer = formats.make_writer(args.format, dst, layer_ids, num_layers, hidden, args.model or manifest.get("model"))
    removed = writer.clean()
    if removed:
        say(f"export resume: removed {len(removed)} unfinished temporary file(s)")
    token_ids, masks = _token_lists(src, reader, n)
    masked = _masked_freq(src, token_ids, masks, int(manifest.get("vocab_size") or 0)
                          or 1 + max(max(t) for t in token_ids))
    if (src / "token_freq.safetensors").is_file():
        _io.place_file(src / "token_freq.safetensors", dst / "token_freq.safetensors", move=False)
    writer.write_dataset(token_ids, masks, masked)

    sglang_ids = None
    if args.format is formats.Format.SPECFORGE:
        sglang_ids = draft_export.renumber(layer_ids[:-1], "vllm", "sglang")
        say(f"export note: SpecForge's draft config takes these auxiliary layers as eagle_aux_hidden_state_layer_ids "
            f"{sglang_ids} (SGLang numbering, one lower than vLLM's {layer_ids[:-1]})")

    def write_manifest(status: str, done: int) -> None:
        m = {**manifest, **origin, "status": status, "finished": done,
             "files": {**writer.files(), "prepared": "prepared.safetensors"}}
        if sglang_ids is not None:
            m["sglang_aux_layer_ids"] = sglang_ids
        _io.atomic_write_json(m, dst / "manifest.json")

    if (src / "prepared.safetensors").is_file():
        _io.place_file(src / "prepared.safetensors", dst / "prepared.safetensors", move=False)
        writer.masks_elsewhere = True  # sample files without a loss mask take it from there
    write_manifest("running", 0)
    done, missing = 0, []
    how: Counter[str] = Counter()
    for i in range(n):
        if writer.complete(i, len(token_ids[i])):
            done += 1
            continue
        header = reader.header(i)
        if header is None:
            missing.append(i)
            continue
        placed = writer.adopt(i, reader.path(i), header, move=False)
        if placed is None:
            writer.write(i, reader.load(i))
        how[placed or "rewritten"] += 1
        done += 1
        if done % args.progress_every == 0:
            say(f"export progress: {done}/{n} samples")
    write_manifest("complete" if not missing else "incomplete", done)
    say(f"export files: {how['linked']} linked, {how['copied']} copied, {how['rewritten']} rewritten")
    say(f"export done: {done} samples in {time.monotonic() - t0:.1f}s")
    if missing:
        say(f"export incomplete: {len(missing)} of {n} samples are missing in {src} (first: {missing[:10]}); "
            "finish the extraction and export again")
        return EXIT_INCOMPLETE
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return export(args)
    except formats.FormatError as e:
        say(f"export error: {e}")
        return EXIT_CONFIG
    except OSError as e:
        if isinstance(e, _io.DiskFull) or e.errno in (errno.ENOSPC, errno.EDQUOT):
            say(f"export error: disk full writing {getattr(e, 'path', None) or e.filename}: free space and relaunch")
            return EXIT_DISK_FULL
        raise


if __name__ == "__main__":
    sys.exit(main())
