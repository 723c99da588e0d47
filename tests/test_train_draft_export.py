"""eagle3.draft_export: a trained draft with its auxiliary layer ids in SGLang's numbering (one lower than
vLLM's), the weights hard-linked; and back."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

import extract_helpers  # noqa: F401 - puts jobs/ on the path
from eagle3 import draft_export
from eagle3.draft import DraftConfig


def test_renumbering_matches_specforge_s_deepseek_v3_draft_config():
    # SpecForge's configs/deepseek-v3-671b-eagle3.json lists [1, 29, 57] for the 61-layer target, the
    # layers whose inputs vLLM calls 2, 30, 58 (this job's default 2, L//2, L-3 for L = 61).
    assert draft_export.renumber([2, 30, 58], "vllm", "sglang") == [1, 29, 57]
    assert draft_export.renumber([1, 29, 57], "sglang", "vllm") == [2, 30, 58]
    assert draft_export.renumber([2, 30, 58], "vllm", "vllm") == [2, 30, 58]
    with pytest.raises(draft_export.NumberingError, match="negative id"):
        draft_export.renumber([0, 2, 3], "vllm", "sglang")


@pytest.fixture
def draft_dir(tmp_path):
    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, vocab_size=512, draft_vocab_size=100, aux_layer_ids=[2, 30, 58],
                      rms_norm_eps=1e-6)
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg.vllm_config()))
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "train_info.json").write_text("{}")
    (d / "checkpoints").mkdir()
    return d


def test_a_draft_written_for_sglang_and_back(draft_dir, tmp_path, capsys):
    sg = tmp_path / "sglang"
    assert draft_export.main([str(draft_dir), str(sg), "--numbering", "sglang"]) == 0
    assert capsys.readouterr().out == f"draft export: 3 files into {sg}, layer ids [1, 29, 57] (sglang numbering)\n"
    src, cfg = json.loads((draft_dir / "config.json").read_text()), json.loads((sg / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True and cfg["eagle3_layer_numbering"] == "sglang"
    changed = {k for k in set(src) | set(cfg) if src.get(k) != cfg.get(k)}
    assert changed == {"eagle_aux_hidden_state_layer_ids", "eagle_config", "eagle3_layer_numbering"}
    assert os.path.samefile(draft_dir / "model.safetensors", sg / "model.safetensors")
    assert sorted(p.name for p in sg.iterdir()) == ["config.json", "model.safetensors", "train_info.json"]
    back = tmp_path / "vllm"
    assert draft_export.main([str(sg), str(back), "--numbering", "vllm"]) == 0
    cfg = json.loads((back / "config.json").read_text())
    assert {**cfg, "eagle3_layer_numbering": None} == {**src, "eagle3_layer_numbering": None}


def test_refusals_are_one_line(draft_dir, tmp_path, capsys):
    cfg = json.loads((draft_dir / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    (draft_dir / "config.json").write_text(json.dumps(cfg))
    assert draft_export.main([str(draft_dir), str(tmp_path / "x"), "--numbering", "sglang"]) == 78
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("draft export error: layer ids [0, 1, 2] (vllm numbering)")
    assert draft_export.main([str(draft_dir), str(draft_dir), "--numbering", "vllm"]) == 78
    assert draft_export.main([str(tmp_path / "none"), str(tmp_path / "y"), "--numbering", "vllm"]) == 78
