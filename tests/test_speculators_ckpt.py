"""eagle3.speculators_ckpt: a trained draft written as speculators saves an Eagle3Speculator
(speculators_config, transformer_layer_config, tensors layers.0.*, a zero fc.bias)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import extract_helpers  # noqa: E402, F401 - puts jobs/ on the path
from eagle3 import speculators_ckpt  # noqa: E402
from eagle3.draft import DraftConfig, Eagle3Draft, export_tensors  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


@pytest.fixture
def draft_dir(tmp_path):
    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, vocab_size=512, draft_vocab_size=100, aux_layer_ids=[1, 3, 5])
    torch.manual_seed(0)
    model = Eagle3Draft(cfg)
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg.vllm_config()))
    save_file(export_tensors(model), str(d / "model.safetensors"))
    (d / "train_info.json").write_text("{}")
    return d


def test_a_draft_written_with_speculators_names_and_config(draft_dir, tmp_path, capsys):
    dst = tmp_path / "spec"
    rc = speculators_ckpt.main([str(draft_dir), str(dst), "--verifier", "tiny/mla-moe", "--tokens", "5"])
    assert rc == 0
    assert capsys.readouterr().out.startswith(f"speculators checkpoint: 16 tensors into {dst}")
    ours = load_file(str(draft_dir / "model.safetensors"))
    theirs = load_file(str(dst / "model.safetensors"))
    assert not [k for k in theirs if k.startswith("midlayer.")] and len(theirs) == len(ours) + 1
    for k, v in ours.items():
        assert torch.equal(theirs[k.replace("midlayer.", "layers.0.")], v), k
    assert "layers.0.self_attn.q_proj.weight" in theirs and "layers.0.hidden_norm.weight" in theirs
    assert torch.count_nonzero(theirs["fc.bias"]) == 0 and theirs["fc.bias"].shape == (64,)
    assert theirs["d2t"].dtype == torch.int64 and theirs["t2d"].dtype == torch.bool
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["draft_vocab_size"] == 100 and cfg["transformer_layer_config"]["vocab_size"] == 512
    assert cfg["transformer_layer_config"]["num_key_value_heads"] == 1
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5] and cfg["norm_before_residual"] is False
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"]["name_or_path"] == "tiny/mla-moe"
    # The training record travels by a hard link.
    assert (dst / "train_info.json").stat().st_ino == (draft_dir / "train_info.json").stat().st_ino


def test_the_zero_bias_computes_what_the_draft_computes(draft_dir, tmp_path):
    dst = tmp_path / "spec"
    assert speculators_ckpt.main([str(draft_dir), str(dst)]) == 0
    theirs = load_file(str(dst / "model.safetensors"))
    x = torch.randn(3, 3 * 64, dtype=torch.bfloat16)
    ours = load_file(str(draft_dir / "model.safetensors"))
    assert torch.equal(torch.nn.functional.linear(x, theirs["fc.weight"], theirs["fc.bias"]),
                       torch.nn.functional.linear(x, ours["fc.weight"]))


@pytest.mark.parametrize("case", ["tokens", "missing", "same"])
def test_refusals_are_one_line_exit_78(draft_dir, tmp_path, capsys, case):
    src, dst, extra = draft_dir, tmp_path / "spec", []
    if case == "tokens":
        extra = ["--tokens", "0"]
    elif case == "missing":
        src = tmp_path / "nowhere"
    else:
        dst = draft_dir
    before = (draft_dir / "model.safetensors").read_bytes()
    assert speculators_ckpt.main([str(src), str(dst), *extra]) == 78
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("speculators checkpoint error: ")
    assert (draft_dir / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "spec").exists()
