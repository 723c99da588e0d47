"""eagle3.speculators_ckpt: a trained draft written as speculators saves an Eagle3Speculator
(speculators_config, transformer_layer_config, tensors layers.0.*, no fc.bias), which speculators' own loader
loads, and whose tensors (and those of eagle3.train's own export) vLLM's EAGLE-3 weight loading takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import extract_helpers  # noqa: F401 - puts jobs/ on the path
from eagle3 import speculators_ckpt
from eagle3.draft import DraftConfig, Eagle3Draft, export_tensors
from safetensors.torch import load_file, save_file


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
    assert capsys.readouterr().out.startswith(f"speculators checkpoint: 15 tensors into {dst}")
    ours = load_file(str(draft_dir / "model.safetensors"))
    theirs = load_file(str(dst / "model.safetensors"))
    assert not [k for k in theirs if k.startswith("midlayer.")] and len(theirs) == len(ours)
    for k, v in ours.items():
        assert torch.equal(theirs[k.replace("midlayer.", "layers.0.")], v), k
    assert "layers.0.self_attn.q_proj.weight" in theirs and "layers.0.hidden_norm.weight" in theirs
    assert "fc.bias" not in theirs  # neither speculators' fc nor vLLM's has one
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


@pytest.mark.parametrize("case", ["tokens", "missing", "same", "no_verifier"])
def test_refusals_are_one_line_exit_78(draft_dir, tmp_path, capsys, case):
    src, dst, extra = draft_dir, tmp_path / "spec", ["--verifier", "some/target"]
    if case == "tokens":
        extra += ["--tokens", "0"]
    elif case == "no_verifier":  # train_info.json names no target, and none is given
        extra = []
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


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A draft trained by eagle3.train (two steps) on the train fixture, and its speculators checkpoint written
    with the defaults: (train --out, speculators directory, the extraction's manifest)."""
    from train_helpers import make_fixture, run_train, train_args

    base = tmp_path_factory.mktemp("spec-trained")
    data = make_fixture(tmp_path_factory.getbasetemp() / "train-fixture")
    out = base / "train"
    r = run_train(train_args(data, out, "--max-steps", "2"), timeout=300)
    assert r.returncode == 0, r.stdout
    dst = base / "spec"
    assert speculators_ckpt.main([str(out), str(dst)]) == 0  # no --verifier: the recorded target
    return out, dst, json.loads((data / "manifest.json").read_text())


def test_the_verifier_defaults_to_the_extraction_s_model(trained, capsys):
    out, dst, manifest = trained
    cfg = json.loads((dst / "config.json").read_text())
    target = cfg["speculators_config"]["verifier"]["name_or_path"]
    assert target == json.loads((out / "train_info.json").read_text())["target_model"]
    assert Path(target).resolve() == Path(manifest["model"]).resolve()


def test_speculators_own_loader_loads_the_draft_with_every_tensor_used(trained):
    pytest.importorskip("speculators", reason="the interop tests' packages (tests/requirements-interop.txt)")
    from speculators import SpeculatorModel

    _, dst, _ = trained
    model = SpeculatorModel.from_pretrained(str(dst))  # reads the verifier's embeddings and lm_head too
    state = model.state_dict()
    written = load_file(str(dst / "model.safetensors"))
    unexpected = sorted(set(written) - set(state))
    assert unexpected == []  # e.g. an fc.bias: speculators' fc has none, and it would be dropped
    for k, v in written.items():
        assert torch.equal(state[k].to(v.dtype), v), k
    assert not torch.isnan(model.embed_tokens.weight).any()  # loaded from the verifier, not left at NaN
    assert not torch.isnan(model.verifier_lm_head.weight).any()


def test_both_checkpoints_go_through_vllm_s_eagle3_weight_loading(trained):
    """eagle3.train's own export (midlayer.*) and the speculators one (layers.0.*), by the names and shapes of
    vLLM's llama_eagle3 loader (tests/vllm_eagle3_names.py): every tensor taken, every parameter loaded but
    the embeddings, which vLLM shares from the target."""
    import vllm_eagle3_names as vllm
    from safetensors import safe_open

    out, dst, _ = trained
    draft_cfg = json.loads((out / "config.json").read_text())  # what vLLM reads for either (speculators' maps to it)
    want = set(vllm.parameters(draft_cfg)) - {"model.embed_tokens.weight"}
    for d in (out, dst):
        with safe_open(str(d / "model.safetensors"), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        assert vllm.load(draft_cfg, shapes) == want, d


def test_the_transcribed_loader_refuses_what_vllm_refuses(trained):
    """The transcription is not a rubber stamp: an fc.bias is vLLM 0.23's KeyError, a stray name its ValueError."""
    import vllm_eagle3_names as vllm
    from safetensors import safe_open

    out, _, _ = trained
    cfg = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    with pytest.raises(KeyError, match=r"fc\.bias"):
        vllm.load(cfg, {**shapes, "fc.bias": (cfg["hidden_size"],)})
    with pytest.raises(vllm.UnknownWeight):
        vllm.load(cfg, {**shapes, "lm_head.bias": (cfg["draft_vocab_size"],)})
    with pytest.raises(ValueError, match="q_proj"):
        vllm.load(cfg, {**shapes, "midlayer.self_attn.q_proj.weight": (7, 7)})
