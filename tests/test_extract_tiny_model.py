"""The embedded default model: deterministic, idempotent, sharded; and the job with no model given."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import PROMPTS, TEST_SPEC, run_cli, run_main

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import tiny_model


def tree(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_build_is_deterministic_and_idempotent(tmp_path, capsys):
    a = tiny_model.build(tmp_path / "a", TEST_SPEC, PROMPTS)
    b = tiny_model.build(tmp_path / "b", TEST_SPEC, PROMPTS)
    assert tree(a) == tree(b)
    assert len(list(a.glob("model-*-of-*.safetensors"))) >= 4
    assert tiny_model.is_complete(a)
    mtimes = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    capsys.readouterr()
    tiny_model.build(a, TEST_SPEC, PROMPTS)
    assert capsys.readouterr().out == f"tiny model: already complete in {a}\n"
    assert {p.name: p.stat().st_mtime_ns for p in a.iterdir()} == mtimes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary build dirs left


def test_build_refuses_a_foreign_non_empty_directory(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "something").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        tiny_model.build(tmp_path / "x", TEST_SPEC, PROMPTS)
    (tmp_path / "empty").mkdir()
    assert tiny_model.is_complete(tiny_model.build(tmp_path / "empty", TEST_SPEC, PROMPTS, quiet=True))


def test_a_build_of_another_spec_is_replaced(tmp_path, capsys):
    from dataclasses import replace

    d = tiny_model.build(tmp_path / "m", TEST_SPEC, PROMPTS)
    old = tree(d)
    other = replace(TEST_SPEC, seed=1)
    assert not tiny_model.is_complete(d, other, PROMPTS)
    tiny_model.build(d, other, PROMPTS)
    assert "tiny model: replacing the build in" in capsys.readouterr().out
    assert tiny_model.is_complete(d, other, PROMPTS) and tree(d) != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_tokenizer_round_trips_and_has_a_chat_template(tmp_path):
    from transformers import AutoTokenizer

    d = tiny_model.build(tmp_path / "m", TEST_SPEC, PROMPTS, quiet=True)
    tok = AutoTokenizer.from_pretrained(d)
    text = "Naïve café — 3 × 4 = 12, ok? 🙂"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["vocab_size"] == len(tok) and cfg["num_hidden_layers"] == TEST_SPEC.num_layers
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_job_with_no_model_builds_the_default_once(tmp_path, capsys):
    """`python -m eagle3.extract` with no --model: the embedded default (8 layers, hidden 256, >= 4 shards)."""
    args = ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--max-samples", "6"]
    r = run_cli(args)
    assert r.returncode == 0, r.stdout
    [d] = (tmp_path / "cache").iterdir()
    assert tiny_model.is_complete(d) and len(list(d.glob("model-*-of-*.safetensors"))) >= 4
    assert r.stdout.splitlines()[0] == "extract phase: model_init"
    assert re.search(r"^tiny model: built in .* \(\d+ shards\)$", r.stdout, re.M)
    assert "Loading weights" in r.stdout  # transformers' own bar, on stderr
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (man["num_hidden_layers"], man["hidden_size"], man["layer_ids"]) == (8, 256, [2, 4, 5, 8])
    rc, stdout = run_main(capsys, [*args, "--model", ""])  # empty --model: the same default
    assert rc == 0 and "tiny model: already complete" in stdout
