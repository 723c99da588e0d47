"""The vLLM backend's own logic, against a fake at the vLLM boundary (tests/fakes/fake_vllm.py)."""

from __future__ import annotations

import json
import re
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

import torch
from extract_helpers import build_test_model
from fakes.fake_vllm import make_api
from safetensors.torch import load_file

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import extract, formats, vllm_backend


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


def run(capsys, api, *argv):
    rc = extract.main(["--backend", "vllm", *[str(a) for a in argv]], vllm_api=api)
    return rc, capsys.readouterr().out.splitlines()


def prepared(out):
    man = json.loads((out / "manifest.json").read_text())
    p = load_file(str(out / "prepared.safetensors"))
    off = p["offsets"].tolist()
    spans = pairwise(off)
    return man, [(p["token_ids"][a:b].tolist(), p["loss_mask"][a:b].tolist()) for a, b in spans]


def fails_for(plan):
    """faults(...) from {sample token ids (tuple): [fault of 1st attempt, fault of 2nd attempt, ...]}."""
    seen: dict[tuple, int] = {}

    def faults(request_number, ids):
        key = tuple(ids)
        n = seen.get(key, 0)
        seen[key] = n + 1
        todo = plan.get(key, [])
        return todo[n] if n < len(todo) else None
    return faults


def sample_tokens(model_dir, n):
    """Token ids of the first n samples, as the job prepares them."""
    from eagle3 import data
    from extract_helpers import PROMPTS
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tuple(s.token_ids) for s in data.prepare(data.load_records(PROMPTS, n), tok, 2048)]


def test_requests_follow_the_example_and_files_move_into_place(tmp_path, model_dir, capsys):
    api = make_api()
    out = tmp_path / "out"
    rc, lines = run(capsys, api, "--model", model_dir, "--out", out, "--max-samples", 10, "--batch-size", 4)
    assert rc == 0, lines
    [llm] = api.llms
    man, samples = prepared(out)
    kw = llm.kwargs
    assert llm.model == str(model_dir)
    assert kw["skip_tokenizer_init"] is True and kw["enable_chunked_prefill"] is False
    assert kw["speculative_config"] == {
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 4]}}}
    staged = Path(kw["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"])
    assert kw["kv_transfer_config"] == {
        "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(staged)}}
    # This launch's own directory on the output's disk (eagle3.staging), removed when the run ends.
    assert staged.parent == out / ".staging" and re.fullmatch(r"shard-0-of-1\.\d+-[0-9a-f]{8}", staged.name)
    assert kw["max_model_len"] == max(man["seq_lens"]) + 1
    # Token-id prompts in sample order, in batches of 4.
    assert [len(c) for c in llm.calls] == [4, 4, 2]
    assert [ids for c in llm.calls for ids in c] == [ids for ids, _ in samples]
    assert sum(x.startswith("extract progress: ") for x in lines) == 3
    reader = formats.Reader(out, formats.Format.SUPERVISE)
    for i, (ids, mask) in enumerate(samples):
        f = load_file(str(out / f"hs_{i}.safetensors"))
        # vLLM's file renamed into place as it is: the loss mask is prepared.safetensors' span.
        assert sorted(f) == ["hidden_states", "token_ids"] and f["token_ids"].tolist() == ids
        assert f["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(f["hidden_states"], llm.hidden_fn(ids, [1, 2, 4]))
        assert reader.load(i).loss_mask.tolist() == mask
    assert list((out / ".staging").iterdir()) == []  # moved files, their .lock files and the launch's directory


def test_vllm_output_checked_against_the_hf_reference(tmp_path, model_dir, capsys):
    """With a fake engine that computes what transformers does, --verify finds no difference."""
    from eagle3.hf_backend import HFBackend

    hf = HFBackend(str(model_dir), device="cpu")

    def hidden_fn(ids, layer_ids):
        return hf.compute([ids], layer_ids, 4)[0]
    api = make_api(hidden_fn=hidden_fn)
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 6, "--verify", 3)
    assert rc == 0
    assert any(re.match(r"extract verify: 3 samples, worst max_abs 0, worst rel 0 ", x) for x in lines), lines


def test_stale_staging_files_of_a_killed_run_are_removed_first(tmp_path, model_dir, capsys):
    staging = tmp_path / ".staging"
    killed = staging / "shard-0-of-1.4242-0badf00d"  # a killed launch's directory: its .owner lock is free
    killed.mkdir(parents=True)
    (killed / ".owner").touch()
    (killed / "0-1234abcd.safetensors").write_bytes(b"stale output of a killed launch")
    (staging / "0.safetensors").write_bytes(b"an older release's flat staging")
    (staging / "0.safetensors.lock").touch()
    (staging / "7.safetensors.lock").touch()
    api = make_api()
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 3)
    assert rc == 0
    assert "extract resume: removed 4 staged entries of ended launches" in lines
    f = load_file(str(tmp_path / "hs_0.safetensors"))
    assert torch.equal(f["hidden_states"], api.llms[0].hidden_fn(f["token_ids"].tolist(), [1, 2, 4]))
    assert list(staging.iterdir()) == []


def test_resume_sends_only_unfinished_samples(tmp_path, model_dir, capsys):
    assert run(capsys, make_api(), "--model", model_dir, "--out", tmp_path, "--max-samples", 8)[0] == 0
    first = {p.name: p.read_bytes() for p in tmp_path.glob("hs_*")}
    (tmp_path / "hs_2.safetensors").unlink()
    (tmp_path / "hs_6.safetensors").unlink()
    api = make_api()
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 8)
    assert rc == 0 and "extract resume: 6/8 samples already finished" in lines
    toks = sample_tokens(model_dir, 8)
    assert [tuple(ids) for c in api.llms[0].calls for ids in c] == [toks[2], toks[6]]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("hs_*")} == first
    # All finished: no engine is started at all.
    api = make_api()
    assert run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 8)[0] == 0
    assert api.llms == []


@pytest.mark.parametrize("fault", ["abort", "no_path", "missing", "partial", "stale_lock", "wrong_tokens"])
def test_a_failed_request_is_retried_once(tmp_path, model_dir, capsys, fault):
    toks = sample_tokens(model_dir, 5)
    api = make_api(faults=fails_for({toks[1]: [fault], toks[3]: [fault]}))
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 5,
                    "--file-timeout", "0.3")
    assert rc == 0, lines
    warns = [x for x in lines if x.startswith("extract warning: sample")]
    assert len(warns) == 2 and all(x.endswith("will retry") for x in warns), warns
    assert [len(c) for c in api.llms[0].calls] == [5, 2]  # the retries go in a later batch
    assert len(list(tmp_path.glob("hs_*.safetensors"))) == 5
    assert list((tmp_path / ".staging").iterdir()) == []


@pytest.mark.parametrize("fault", ["late", "prealloc"])
def test_a_file_being_written_is_waited_for_on_its_lock(tmp_path, model_dir, capsys, fault):
    toks = sample_tokens(model_dir, 3)
    api = make_api(faults=fails_for({toks[0]: [fault], toks[2]: [fault]}))
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 3)
    assert rc == 0 and not any("warning" in x for x in lines), lines
    assert [len(c) for c in api.llms[0].calls] == [3]
    for i in (0, 2):
        f = load_file(str(tmp_path / f"hs_{i}.safetensors"))
        assert torch.equal(f["hidden_states"], api.llms[0].hidden_fn(list(toks[i]), [1, 2, 4]))


def test_a_sample_that_fails_twice_is_counted_and_retried_by_a_relaunch(tmp_path, model_dir, capsys):
    toks = sample_tokens(model_dir, 6)
    api = make_api(faults=fails_for({toks[4]: ["abort", "abort"]}))
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 6)
    assert rc == extract.EXIT_INCOMPLETE
    assert "giving up on it for this launch" in lines[-4]
    assert re.match(r"extract done: 5 samples, \d+ tokens in", lines[-2])
    assert lines[-1] == "extract incomplete: 1 of 6 samples failed (4); relaunch to retry them"
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["status"] == "incomplete" and man["failed"] == [4] and man["finished"] == 5
    api = make_api()
    rc, lines = run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 6)
    assert rc == 0 and [tuple(ids) for c in api.llms[0].calls for ids in c] == [toks[4]]
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "complete"


def test_consecutive_failures_abort_the_run(tmp_path, model_dir, capsys):
    api = make_api(faults=lambda n, ids: "abort")
    with pytest.raises(vllm_backend.TooManyFailures, match="3 requests failed in a row"):
        run(capsys, api, "--model", model_dir, "--out", tmp_path, "--max-samples", 6,
            "--max-consecutive-failures", 3)
    assert not list(tmp_path.glob("hs_*"))


@pytest.fixture
def deepseek_dir(tmp_path):
    """A DeepSeek-V2 config (no weights: the fake engine needs none) and a token-id prompt set."""
    d = tmp_path / "deepseek"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 6,
        "hidden_size": 32, "vocab_size": 100, "max_position_embeddings": 256}))
    prompts = tmp_path / "tokens.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": list(range(3, 3 + n))}) + "\n" for n in (5, 9, 17)))
    return d, prompts


def test_deepseek_final_layer_refused_up_front_on_old_vllm(tmp_path, deepseek_dir, capsys):
    model, prompts = deepseek_dir
    api = make_api(version="0.23.0")
    with pytest.raises(vllm_backend.FinalLayerUnsupported, match="needs vLLM >= "):
        run(capsys, api, "--model", model, "--prompts", prompts, "--out", tmp_path / "a")
    assert api.llms == []  # refused before any engine start
    # Without id L it runs; --force tries anyway (with a warning); a newer vLLM is let through.
    assert run(capsys, api, "--model", model, "--prompts", prompts, "--out", tmp_path / "b",
               "--layer-ids", "2,3")[0] == 0
    rc, lines = run(capsys, make_api(version="0.23.0"), "--model", model, "--prompts", prompts,
                    "--out", tmp_path / "c", "--force")
    assert rc == 0 and any(x.startswith("extract warning: forced past: layer id 6") for x in lines)
    assert run(capsys, make_api(version="0.24.1"), "--model", model, "--prompts", prompts,
               "--out", tmp_path / "d")[0] == 0
    f = load_file(str(tmp_path / "d" / "hs_2.safetensors"))
    assert f["hidden_states"].shape == (17, 3, 32)  # default ids for L=6: 2, 3, 3, 6 -> [2, 3, 6]
    with pytest.raises(vllm_backend.VllmTooOld):
        run(capsys, make_api(version="0.17.1"), "--model", model, "--prompts", prompts, "--out", tmp_path / "e",
            "--layer-ids", "2")


def test_check_vllm_unit():
    cfg = {"model_type": "kimi_vl", "text_config": {"model_type": "deepseek_v3", "num_hidden_layers": 61}}
    with pytest.raises(vllm_backend.FinalLayerUnsupported):
        vllm_backend.check_vllm(cfg, [2, 30, 58, 61], 61, "0.23.0")
    assert vllm_backend.check_vllm(cfg, [2, 30, 58], 61, "0.23.0") is None
    assert vllm_backend.check_vllm({"model_type": "llama"}, [2, 16, 29, 32], 32, "0.18.0") is None
    assert vllm_backend.version_tuple("0.23.1.dev3+gabc") == (0, 23, 1)


def test_full_staging_disk_stops_cleanly(tmp_path, model_dir, capsys):
    """The engine's writer cannot write a file (its disk is full): exit 75, not a retry loop."""
    staging = tmp_path / "out" / ".staging"
    staging.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(staging)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        rc, lines = run(capsys, make_api(), "--model", model_dir, "--out", tmp_path / "out", "--max-samples", 24,
                        "--file-timeout", "0.3", "--batch-size", 4)
        assert rc == 75, lines
        m = re.match(r"^extract error: disk full writing (\S+): free space and relaunch; finished samples are kept$",
                     lines[-1])
        assert m and m.group(1).startswith(str(staging)), lines
        assert not any("will retry" in x for x in lines)
        done = len(list((tmp_path / "out").glob("hs_*.safetensors")))
        assert 0 < done < 24 and not list((tmp_path / "out").glob(".*.tmp-*"))
    finally:
        subprocess.run(["umount", "-l", str(staging)], check=False)


def test_missing_vllm_is_a_clear_error(tmp_path, model_dir, capsys):
    if vllm_backend.installed_vllm_version() is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ModuleNotFoundError, match="vLLM is not installed"):
        extract.main(["--backend", "vllm", "--model", str(model_dir), "--out", str(tmp_path)])


def test_prompts_sharing_an_opening_get_every_token_s_hidden_state(tmp_path, model_dir, capsys):
    """vLLM caches full KV blocks shared with earlier prompts and the connector then writes only the
    rows it computed (seen on an H200: 176 of 192): prefix caching must be off for extraction."""
    opening = [1] + [7 + (i % 50) for i in range(47)]  # three full 16-token blocks
    prompts = tmp_path / "shared.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": opening + [100 + k] * (5 + k)}) + "\n" for k in range(6)))
    api = make_api()
    out = tmp_path / "out"
    rc, lines = run(capsys, api, "--model", model_dir, "--out", out, "--prompts", prompts)
    assert rc == 0, lines
    assert api.llms[0].kwargs["enable_prefix_caching"] is False
    _man, samples = prepared(out)
    for i, (ids, _) in enumerate(samples):
        hs = load_file(str(out / f"hs_{i}.safetensors"))
        assert hs["hidden_states"].shape[0] == len(ids) == hs["token_ids"].shape[0]
