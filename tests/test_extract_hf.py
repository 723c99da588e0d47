"""The extraction job with the transformers backend: output contract, layer semantics, resume, lines."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

import torch
from extract_helpers import JOBS, build_test_model, ended_pid, output_files
from safetensors.torch import load_file

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import extract

PROGRESS = re.compile(r"^extract progress: (\d+)/(\d+) samples, (\d+\.\d) tok/s$")
DONE = re.compile(r"^extract done: (\d+) samples, (\d+) tokens in (\d+\.\d)s$")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


def run(capsys, *argv):
    rc = extract.main([str(a) for a in argv])
    return rc, capsys.readouterr().out.splitlines()


def test_output_contract_shapes_dtypes_manifest_and_lines(tmp_path, model_dir, capsys):
    out = tmp_path / "out"
    rc, lines = run(capsys, "--model", model_dir, "--out", out, "--max-samples", 10, "--batch-size", 3)
    assert rc == 0
    assert lines[0] == "extract phase: model_init"
    assert "extract phase: extracting" in lines
    prog = [PROGRESS.match(x) for x in lines if x.startswith("extract progress")]
    assert all(prog) and [int(m.group(1)) for m in prog] == [3, 6, 9, 10]
    assert all(m.group(2) == "10" for m in prog)
    m = DONE.match(lines[-1])
    assert m and m.group(1) == "10"

    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man["num_samples"] == 10 and man["finished"] == 10
    assert man["num_hidden_layers"] == 4 and man["hidden_size"] == 64 and man["dtype"] == "bfloat16"
    assert man["layer_ids"] == [1, 2, 4]  # default 2, L//2, L-3, L for L=4, de-duplicated, ascending
    assert int(m.group(2)) == man["total_tokens"] == sum(man["seq_lens"])
    for i, t in enumerate(man["seq_lens"]):
        f = load_file(str(out / f"hs_{i}.safetensors"))
        assert set(f) == {"hidden_states", "token_ids", "loss_mask"}
        assert f["hidden_states"].dtype == torch.bfloat16 and f["hidden_states"].shape == (t, 3, 64)
        assert f["token_ids"].dtype == torch.int64 and f["token_ids"].shape == (t,)
        assert f["loss_mask"].dtype == torch.uint8 and f["loss_mask"].shape == (t,)
        assert torch.isfinite(f["hidden_states"].float()).all()
    freq = load_file(str(out / "token_freq.safetensors"))
    assert int(freq["token_freq_all"].sum()) == man["total_tokens"]
    prep = load_file(str(out / "prepared.safetensors"))
    assert prep["offsets"].tolist()[-1] == man["total_tokens"]
    assert not list(out.glob(".*.tmp-*"))


def test_layer_numbering_matches_vllm(tmp_path, model_dir, capsys):
    """id k < L is transformers' hidden_states[k]; id L is the last layer's output before the norm."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    rc, _ = run(capsys, "--model", model_dir, "--out", out, "--max-samples", 4, "--layer-ids", "0,1,2,3,4",
                "--dtype", "float32", "--batch-size", 1)
    assert rc == 0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    L = model.config.num_hidden_layers
    for i in range(4):
        f = load_file(str(out / f"hs_{i}.safetensors"))
        ids = f["token_ids"][None]
        with torch.no_grad():
            ref = model(ids, output_hidden_states=True).hidden_states
        got = f["hidden_states"].float()
        for k in range(L):
            assert torch.allclose(got[:, k], ref[k][0].to(torch.bfloat16).float(), rtol=1e-2, atol=1e-6), k
        # transformers' hidden_states[L] is after the final norm: not what id L means.
        assert not torch.allclose(got[:, L], ref[L][0], rtol=0.1, atol=1e-3)
        # Independent pre-norm output: the same model with the final norm taken out.
        norm = model.model.norm
        model.model.norm = torch.nn.Identity()
        try:
            with torch.no_grad():
                pre = model(ids, output_hidden_states=True).hidden_states[L][0]
        finally:
            model.model.norm = norm
        assert torch.allclose(got[:, L], pre.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-6)
        assert torch.allclose(norm(pre), ref[L][0], rtol=1e-4, atol=1e-5)


def test_resume_skips_finished_samples_and_never_rewrites_them(tmp_path, model_dir, capsys):
    out = tmp_path / "out"
    args = ("--model", model_dir, "--out", out, "--max-samples", 12, "--batch-size", 4)
    assert run(capsys, *args)[0] == 0
    first = output_files(out)
    stat = {i: (out / f"hs_{i}.safetensors").stat() for i in range(12)}
    # Lose samples 5 and 9 (chunks [4..7] and [8..11]), plus a leftover temporary file.
    (out / "hs_5.safetensors").unlink()
    (out / "hs_9.safetensors").write_bytes(first["hs_9.safetensors"][:100])  # truncated: not finished
    (out / f".hs_9.safetensors.tmp-{ended_pid()}").write_bytes(b"partial")
    rc, lines = run(capsys, *args)
    assert rc == 0
    assert "extract resume: removed 1 unfinished temporary file(s)" in lines
    assert "extract resume: 10/12 samples already finished" in lines
    assert output_files(out) == first
    for i in set(range(12)) - {5, 9}:
        st = (out / f"hs_{i}.safetensors").stat()
        assert (st.st_ino, st.st_mtime_ns) == (stat[i].st_ino, stat[i].st_mtime_ns), i
    # Everything finished: a relaunch loads no model and changes nothing.
    rc, lines = run(capsys, *args)
    assert rc == 0 and "extract phase: extracting" not in lines
    assert lines[-2:] == ["extract resume: 12/12 samples already finished", lines[-1]]
    assert DONE.match(lines[-1]).group(1) == "12"
    assert output_files(out) == first


def test_relaunch_with_other_settings_is_refused(tmp_path, model_dir, capsys):
    out = tmp_path / "out"
    assert run(capsys, "--model", model_dir, "--out", out, "--max-samples", 2)[0] == 0
    with pytest.raises(extract.OutputMismatch, match="layer_ids"):
        run(capsys, "--model", model_dir, "--out", out, "--max-samples", 2, "--layer-ids", "1,2")
    with pytest.raises(extract.OutputMismatch, match="data_sha256"):
        run(capsys, "--model", model_dir, "--out", out, "--max-samples", 3)


def test_verify_reports_per_layer_errors(tmp_path, model_dir, capsys):
    out = tmp_path / "out"
    rc, lines = run(capsys, "--model", model_dir, "--out", out, "--max-samples", 6, "--verify", 2)
    assert rc == 0
    per_layer = [x for x in lines if re.match(r"^extract verify: sample \d+ layer \d+: max_abs \S+, rel \S+$", x)]
    assert len(per_layer) == 2 * 3
    assert any(x.startswith("extract verify: 2 samples, worst max_abs") for x in lines)
    man = json.loads((out / "manifest.json").read_text())
    assert man["verify"]["samples"] == [0, 5] and man["verify"]["worst_rel"] < 0.05
    # A corrupted sample (right shapes, wrong values) fails verification.
    f = load_file(str(out / "hs_0.safetensors"))
    f["hidden_states"] = f["hidden_states"] * 2
    from safetensors.torch import save_file

    save_file(f, str(out / "hs_0.safetensors"))
    with pytest.raises(extract.VerifyFailed):
        run(capsys, "--model", model_dir, "--out", out, "--max-samples", 6, "--verify", 2)


def test_bad_layer_ids_fail_before_anything_loads(tmp_path, model_dir, capsys):
    with pytest.raises(ValueError, match=r"0\.\.4"):
        run(capsys, "--model", model_dir, "--out", tmp_path / "o", "--layer-ids", "1,5")
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_default_layer_ids():
    assert extract.default_layer_ids(8) == [2, 4, 5, 8]
    assert extract.default_layer_ids(32) == [2, 16, 29, 32]
    assert extract.default_layer_ids(61) == [2, 30, 58, 61]
    assert extract.default_layer_ids(4) == [1, 2, 4]


def test_job_programs_never_import_supervisor():
    for p in JOBS.rglob("*.py"):
        src = p.read_text()
        assert not re.search(r"^\s*(import supervisor|from supervisor)\b", src, re.M), p
