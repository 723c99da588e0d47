"""extract --format speculators|specforge and eagle3.export, read back by the trainers' own code.

speculators 0.9: its own data pipeline (``speculators.train.dataloader.create_train_val_loaders``:
``ArrowDataset`` over ``datasets.load_from_disk`` + ``FileTransfer`` over ``hidden_states/``, its collate
and EAGLE-3 ``shift_batch``) loads our output to a batch of tensors. Its trainer itself cannot run on
a CPU: ``Trainer.setup_model`` moves the model to ``local_rank`` (``.to(0)``, a CUDA device).

SpecForge 0.2: its package imports SGLang at import time (``specforge/__init__`` → ``modeling`` →
``eagle3_target_model``), so its ``OfflineEagle3Dataset`` cannot be imported here; ``specforge_process``
below is a reader written from that class's documented file format and processing
(``specforge/data/preprocessing.py`` at v0.2.0, and ``DataPoint`` in ``scripts/prepare_hidden_states.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from extract_helpers import build_test_model, ended_pid, run_cli
from train_helpers import THIRD_PARTY_WARNINGS

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

LAYERS = "1,2,3,4"  # the 4-layer test model: 3 auxiliary layers and the last


def run_export(*args: str):
    import subprocess
    import sys

    from extract_helpers import REPO, cli_env

    return subprocess.run([sys.executable, "-m", "eagle3.export", *map(str, args)], cwd=REPO, env=cli_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_test_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def ours(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ours")
    r = run_cli(["--model", model, "--out", out, "--max-samples", "8", "--layer-ids", LAYERS, "--device", "cpu"])
    assert r.returncode == 0, r.stdout
    return out


def specforge_process(path: Path, max_len: int = 2048) -> dict:
    """One SpecForge 0.2 offline sample as ``OfflineEagle3Dataset.process_data`` prepares it (reader written
    from its file format: torch.load of input_ids [T], loss_mask [T], aux_hidden_state [1,T,3H], hidden_state
    [1,T,H]; squeezed, cut to max_len, batch dimension added, the last loss-mask position zeroed)."""
    data = torch.load(path, weights_only=False)
    assert set(data) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
    loss_mask = data["loss_mask"][:max_len][None, :].clone()
    loss_mask[0, -1] = 0
    return {"input_ids": data["input_ids"][:max_len][None, :], "loss_mask": loss_mask,
            "hidden_state": data["aux_hidden_state"].squeeze(0)[:max_len][None, :],
            "target": data["hidden_state"].squeeze(0)[:max_len][None, :],
            "attention_mask": torch.ones_like(loss_mask, dtype=torch.long)}


def test_specforge_layout_holds_post_norm_states_that_match_transformers(model, ours, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sf"
    r = run_cli(["--model", model, "--out", out, "--max-samples", "8", "--layer-ids", LAYERS, "--device", "cpu",
                 "--format", "specforge"])
    assert r.returncode == 0, r.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["output_format"] == "specforge" and manifest["status"] == "complete"
    # SpecForge's draft config names the auxiliary layers one lower (SGLang's numbering).
    assert manifest["sglang_aux_layer_ids"] == [k - 1 for k in manifest["layer_ids"][:-1]]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ckpt"))
    assert files == sorted(f"rows_0-2000/data_{i}.ckpt" for i in range(8))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for i in (0, 5):
        got = specforge_process(out / f"rows_0-2000/data_{i}.ckpt")
        mine = load_file(str(ours / f"hs_{i}.safetensors"))
        assert torch.equal(got["input_ids"][0], mine["token_ids"])
        assert torch.equal(got["hidden_state"][0], mine["hidden_states"][:, :3].flatten(1))
        with torch.no_grad():
            ref = hf(input_ids=mine["token_ids"][None], output_hidden_states=True).hidden_states[-1][0]
        # transformers' last hidden state is after the final norm: SpecForge's "hidden_state"
        torch.testing.assert_close(got["target"][0].float(), ref, rtol=0.02, atol=0.02)
    # the export from our layout gives the same files, byte for byte
    exp = tmp_path / "sf-export"
    r = run_export(ours, exp, "--format", "specforge")
    assert r.returncode == 0, r.stdout
    ids = manifest["sglang_aux_layer_ids"]
    note = ("export note: SpecForge's draft config takes these auxiliary layers as "
            f"eagle_aux_hidden_state_layer_ids {ids} ")
    assert note in r.stdout, r.stdout
    assert json.loads((exp / "manifest.json").read_text())["sglang_aux_layer_ids"] == ids
    for f in files:
        assert (exp / f).read_bytes() == (out / f).read_bytes(), f


def test_specforge_export_without_the_final_norm_is_refused_in_one_line(ours, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ours, src)
    m = json.loads((src / "manifest.json").read_text())
    m["model"] = str(tmp_path / "gone")
    (src / "manifest.json").write_text(json.dumps(m))
    r = run_export(src, tmp_path / "dst", "--format", "specforge")
    assert r.returncode == 78
    assert r.stdout.splitlines() == [f"export error: --format specforge needs the target's final-norm weight: "
                                     f"{tmp_path / 'gone'} has no readable config.json (pass --model DIR, the "
                                     "target's local model directory)"]
    assert not list((tmp_path / "dst").rglob("*.ckpt"))


def test_export_resumes_and_refuses_another_layout(ours, tmp_path):
    pytest.importorskip("datasets")
    dst = tmp_path / "spec"
    r = run_export(ours, dst, "--format", "speculators")
    assert r.returncode == 0, r.stdout
    before = {p: p.read_bytes() for p in (dst / "hidden_states").iterdir()}
    (dst / "hidden_states" / "hs_3.safetensors").unlink()
    (dst / "hidden_states" / f".hs_4.safetensors.tmp-{ended_pid()}").write_bytes(b"half")  # a killed write
    mtimes = {p: p.stat().st_mtime_ns for p in before if p.name != "hs_3.safetensors"}
    r = run_export(ours, dst, "--format", "speculators")
    assert r.returncode == 0, r.stdout
    assert "export resume: removed 1 unfinished temporary file(s)" in r.stdout
    assert {p: p.read_bytes() for p in (dst / "hidden_states").iterdir()} == before
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # the finished ones were not rewritten
    assert json.loads((dst / "manifest.json").read_text())["output_format"] == "speculators"
    r = run_export(ours, dst, "--format", "supervise")
    assert r.returncode == 78 and "differs in: output_format" in r.stdout


@pytest.mark.slow
def test_speculators_own_data_pipeline_loads_our_output(model, ours, tmp_path):
    pytest.importorskip("speculators", reason="speculators==0.9.0 (jobs/requirements-interop.txt)")
    from hs_connectors.transfer import FileTransfer
    from safetensors.torch import load_file
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    out = tmp_path / "spec"
    r = run_cli(["--model", model, "--out", out, "--max-samples", "8", "--layer-ids", LAYERS, "--device", "cpu",
                 "--format", "speculators"])
    assert r.returncode == 0, r.stdout
    assert json.loads((out / "manifest.json").read_text())["output_format"] == "speculators"
    train, val = create_train_val_loaders(
        data_path=str(out), total_seq_len=4096, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(out / "hidden_states"), vllm_endpoint="http://127.0.0.1:9/v1", on_missing="raise",
        verifier_name_or_path=str(model), request_timeout=1, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=1, hidden_size=64, num_target_layers=3, num_workers=0,
        prefetch_factor=None, preprocess=shift_batch, train_data_ratio=0.5, seed=0)
    batches = list(train) + list(val)  # packed: each batch is [1, total_seq_len], documents numbered
    manifest = json.loads((ours / "manifest.json").read_text())
    valid = sum(int((b["document_ids"][0] >= 0).sum()) for b in batches)
    assert valid == sum(n - 1 for n in manifest["seq_lens"])  # every sample, less the one shift_batch drops
    b = batches[0]
    assert b["hidden_states"].shape[-1] == 3 * 64 and b["verifier_last_hidden_states"].shape[-1] == 64
    n = int((b["document_ids"][0] == b["document_ids"][0, 0]).sum())
    # the first packed sample, wherever its row came from, is one of ours with the layers split as we store them
    firsts = {i: load_file(str(ours / f"hs_{i}.safetensors")) for i in range(8)}
    i = next(i for i, d in firsts.items() if d["token_ids"].shape[0] == n + 1
             and torch.equal(d["token_ids"][1:], b["input_ids"][0, :n]))
    hs = firsts[i]["hidden_states"]
    assert torch.equal(b["hidden_states"][0, :n], hs[:-1, :3].flatten(1))
    assert torch.equal(b["verifier_last_hidden_states"][0, :n], hs[1:, 3])
    assert torch.equal(b["loss_mask"][0, :n].to(torch.uint8), firsts[i]["loss_mask"][1:])
    # token_freq.pt equals what speculators' own counter writes from the same dataset
    from datasets import load_from_disk

    save_token_frequency_distribution(load_from_disk(str(out)), tmp_path / "theirs.pt")
    assert torch.load(out / "token_freq.pt") == torch.load(tmp_path / "theirs.pt")
