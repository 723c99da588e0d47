"""Lean I/O: vLLM's staged files are renamed into place (written once), exports hard-link.

Bytes written are the ``wchar`` of /proc/self/io around the run: every write of this process and its
threads, the fake engine's staged-file writes (tests/fakes/fake_vllm.py) included, as vLLM's would be.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

import extract_helpers  # noqa: F401 - puts jobs/ on the path
import torch
from fakes.fake_vllm import default_hidden_fn, make_api
from safetensors.torch import load_file

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import _io, export, extract, formats

HIDDEN, LAYERS, N = 512, 4, 12
N_STORED = len(extract.default_layer_ids(LAYERS))  # [1, 2, 4]


def wchar() -> int:
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        pytest.skip("no /proc/self/io here")
    return int(re.search(r"^wchar: (\d+)$", text, re.M).group(1))


@pytest.fixture
def target(tmp_path):
    """A config-only target (the fake engine needs no weights) and token-id prompts of 40..120 tokens."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN, "vocab_size": 1000, "max_position_embeddings": 512}))
    prompts = tmp_path / "tokens.jsonl"
    lens = [40 + 7 * k for k in range(N)]
    prompts.write_text("".join(json.dumps({"token_ids": [3 + (k * 31 + j * 17) % 990 for j in range(n)]}) + "\n"
                               for k, n in enumerate(lens)))
    return d, prompts, sum(lens) * N_STORED * HIDDEN * 2


def extract_vllm(capsys, model, prompts, out, api=None, *extra):
    rc = extract.main(["--backend", "vllm", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
                       "--batch-size", "5", *map(str, extra)], vllm_api=api or make_api())
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0, lines
    return lines


def test_vllm_staged_files_are_renamed_into_place_written_once(tmp_path, target, capsys):
    model, prompts, hs_bytes = target
    out = tmp_path / "out"
    renamed = _io.stats["renamed"]
    w0 = wchar()
    extract_vllm(capsys, model, prompts, out)
    ratio = (wchar() - w0) / hs_bytes
    assert ratio <= 1.05, f"{ratio:.3f} bytes written per byte of hidden state"
    assert _io.stats["renamed"] - renamed == N
    assert list((out / ".staging").iterdir()) == []
    reader = formats.Reader(out, formats.Format.SUPERVISE)
    prepared = load_file(str(out / "prepared.safetensors"))
    off = prepared["offsets"].tolist()
    for i in range(N):
        f = load_file(str(out / f"hs_{i}.safetensors"))
        assert sorted(f) == ["hidden_states", "token_ids"] and f["hidden_states"].dtype == torch.bfloat16
        assert _io.sample_file_ok(out / f"hs_{i}.safetensors", off[i + 1] - off[i], N_STORED, HIDDEN)
        assert torch.equal(reader.load(i).loss_mask, prepared["loss_mask"][off[i]:off[i + 1]])


def test_a_staged_file_in_another_dtype_is_rewritten_with_its_mask(tmp_path, target, capsys):
    model, prompts, _ = target
    fn = default_hidden_fn(HIDDEN)
    api = make_api(hidden_fn=lambda ids, layer_ids: fn(ids, layer_ids).to(torch.float16))
    renamed = _io.stats["renamed"]
    extract_vllm(capsys, model, prompts, tmp_path / "out", api)
    assert _io.stats["renamed"] == renamed
    f = load_file(str(tmp_path / "out" / "hs_3.safetensors"))
    assert sorted(f) == ["hidden_states", "loss_mask", "token_ids"] and f["hidden_states"].dtype == torch.bfloat16


def test_shards_rename_too_and_gather_equals_the_unsharded_output(tmp_path, target, capsys):
    """Each shard writes the whole set's prepared data (the loss masks), so its files are renamed into
    place as well; gather links shard 0's as prepared.safetensors. Equal to an unsharded run's."""
    model, prompts, _ = target
    one, out = tmp_path / "one", tmp_path / "sharded"
    extract_vllm(capsys, model, prompts, one)
    renamed = _io.stats["renamed"]
    for shard in (0, 1):
        extract_vllm(capsys, model, prompts, out, None, "--num-shards", 2, "--shard", shard)
    assert _io.stats["renamed"] - renamed == N
    assert extract.main(["gather", "--out", str(out)]) == 0
    assert os.path.samefile(out / "prepared.shard-0-of-2.safetensors", out / "prepared.safetensors")
    for name in ["prepared.safetensors", "token_freq.safetensors"] + [f"hs_{i}.safetensors" for i in range(N)]:
        assert (out / name).read_bytes() == (one / name).read_bytes(), name
    a, b = formats.Reader(out, formats.Format.SUPERVISE), formats.Reader(one, formats.Format.SUPERVISE)
    assert torch.equal(a.load(N - 1).loss_mask, b.load(N - 1).loss_mask)


@pytest.mark.parametrize("fmt", ["supervise", "speculators"])
def test_export_hard_links_where_it_can(tmp_path, target, capsys, fmt):
    if fmt == "speculators":
        pytest.importorskip("datasets")
    model, prompts, hs_bytes = target
    src, dst = tmp_path / "src", tmp_path / "dst"
    extract_vllm(capsys, model, prompts, src)
    w0 = wchar()
    assert export.main([str(src), str(dst), "--format", fmt]) == 0
    ratio = (wchar() - w0) / hs_bytes
    lines = capsys.readouterr().out.splitlines()
    assert f"export files: {N} linked, 0 copied, 0 rewritten" in lines, lines
    assert ratio <= 0.05, ratio
    sub = "hidden_states/" if fmt == "speculators" else ""
    for i in range(N):
        assert os.path.samefile(src / f"hs_{i}.safetensors", dst / f"{sub}hs_{i}.safetensors")
    assert os.path.samefile(src / "prepared.safetensors", dst / "prepared.safetensors")
    a, b = formats.Reader(src, formats.Format.SUPERVISE), formats.Reader(dst, formats.detect(dst))
    for i in (0, N - 1):
        x, y = a.load(i), b.load(i)
        assert torch.equal(x.hidden_states, y.hidden_states) and torch.equal(x.loss_mask.long(), y.loss_mask.long())
    # A relaunch finds everything in place.
    assert export.main([str(src), str(dst), "--format", fmt]) == 0
    assert "export files: 0 linked, 0 copied, 0 rewritten" in capsys.readouterr().out


def test_export_copies_where_linking_is_refused(tmp_path, target, capsys, monkeypatch):
    model, prompts, _ = target
    src, dst = tmp_path / "src", tmp_path / "dst"
    extract_vllm(capsys, model, prompts, src)

    def no_link(a, b):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
    monkeypatch.setattr(os, "link", no_link)
    assert export.main([str(src), str(dst), "--format", "supervise"]) == 0
    assert f"export files: 0 linked, {N} copied, 0 rewritten" in capsys.readouterr().out
    for i in range(N):
        p, q = src / f"hs_{i}.safetensors", dst / f"hs_{i}.safetensors"
        assert not os.path.samefile(p, q) and p.read_bytes() == q.read_bytes()
    assert not list(dst.glob(".*.tmp-*"))


def test_place_file_hooks_leave_the_sample_absent(tmp_path, monkeypatch):
    """A full disk or a kill while a staged file is put into place: the sample is whole or absent."""
    src = tmp_path / "staged.safetensors"
    src.write_bytes(b"x" * 100)
    monkeypatch.setenv("EAGLE3_FAULT_ENOSPC_AFTER", "0")
    with pytest.raises(_io.DiskFull):
        _io.place_file(src, tmp_path / "hs_0.safetensors", move=True, sample=True)
    assert src.is_file() and not (tmp_path / "hs_0.safetensors").exists()
    monkeypatch.delenv("EAGLE3_FAULT_ENOSPC_AFTER")
    assert _io.place_file(src, tmp_path / "hs_0.safetensors", move=True) == "renamed"
    assert not src.exists() and (tmp_path / "hs_0.safetensors").read_bytes() == b"x" * 100
