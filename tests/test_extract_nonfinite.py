"""NaN or Inf in captured hidden states stops the extraction with one line naming the sample and the layer,
before anything of that sample is written (eagle3.finite).

The hf backend runs a real model whose embedding row of one token is Inf (a corrupt weight): only the sample
holding that token goes non-finite. The vLLM backend meets a file with NaN written by the fake engine.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

import torch
from extract_helpers import build_test_model, run_cli
from fakes.fake_vllm import default_hidden_fn, make_api
from safetensors.torch import load_file, save_file

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import extract, finite

BAD_TOKEN = 77
EX_DATAERR = 65  # the exit code of a bad capture: final, sysexits.h EX_DATAERR
LINE = re.compile(r"^extract error: non-finite hidden states in sample (\d+) at layer (\d+): (\d+) NaN and (\d+) Inf "
                  r"values, the first at token (\d+)(?:; also in layers? [\d, ]+)?; nothing of that sample was written$")


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The tiny test model with the embedding row of BAD_TOKEN set to +Inf, and token-id prompts: sample 5 (the
    second batch of 4) holds BAD_TOKEN at position 3, no other sample holds it."""
    base = tmp_path_factory.getbasetemp()
    good = build_test_model(base)
    bad = base / "poisoned-model"
    if not bad.exists():
        shutil.copytree(good, bad)
        index = json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"]
        shard = bad / index["model.embed_tokens.weight"]
        tensors = load_file(str(shard))
        tensors["model.embed_tokens.weight"][BAD_TOKEN] = float("inf")
        save_file(tensors, str(shard), metadata={"format": "pt"})
    prompts = base / "poisoned-prompts.jsonl"
    rows = [[3 + (k * 13 + j * 7) % 70 for j in range(6 + k)] for k in range(8)]  # ids 3..72: never 77
    rows[5][3] = BAD_TOKEN
    prompts.write_text("".join(json.dumps({"token_ids": r}) + "\n" for r in rows))
    return bad, prompts


def test_hf_a_non_finite_batch_stops_the_job_in_one_line_naming_sample_and_layer(tmp_path, poisoned):
    model, prompts = poisoned
    r = run_cli(["--model", str(model), "--prompts", str(prompts), "--out", str(tmp_path), "--batch-size", "4",
                 "--device", "cpu"])
    assert r.returncode == EX_DATAERR, r.stdout
    errors = [x for x in r.stdout.splitlines() if x.startswith("extract error")]
    assert len(errors) == 1 and "Traceback" not in r.stdout, r.stdout
    m = LINE.match(errors[0])
    assert m, errors[0]
    # Layer id 1 (the first asked for: 1, 2, 4) is the input of decoder layer 1: the Inf embedding has gone
    # through layer 0 already (and its NaN reached the earlier positions too: a masked score of NaN stays NaN).
    assert (int(m.group(1)), int(m.group(2))) == (5, 1) and int(m.group(5)) < 11
    # The first batch (samples 0..3) was clean and is kept; nothing of the bad batch was written.
    assert sorted(p.name for p in tmp_path.glob("hs_*.safetensors")) == [f"hs_{i}.safetensors" for i in range(4)]
    for i in range(4):
        assert torch.isfinite(load_file(str(tmp_path / f"hs_{i}.safetensors"))["hidden_states"]).all()


def test_vllm_a_file_holding_nan_stops_the_job_and_is_never_placed(tmp_path, capsys):
    model = build_test_model(tmp_path.parent)
    fn = default_hidden_fn(64)

    def hidden_fn(ids, layer_ids):
        hs = fn(ids, layer_ids)
        if len(ids) == 6:  # sample 3 below (lengths 3 + k)
            hs[4, 1, 10] = float("nan")  # position 4, the second stored layer (id 2)
        return hs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": list(range(3, 9 + k - 3))}) + "\n" for k in range(6)))
    rc = extract.main(["--backend", "vllm", "--model", str(model), "--prompts", str(prompts),
                       "--out", str(tmp_path / "out"), "--batch-size", "2"], vllm_api=make_api(hidden_fn=hidden_fn))
    lines = capsys.readouterr().out.splitlines()
    assert rc == EX_DATAERR, lines
    m = LINE.match(lines[-1])
    assert m and (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(5))) == (3, 2, 1, 4), lines[-1]
    assert not (tmp_path / "out" / "hs_3.safetensors").exists()
    assert (tmp_path / "out" / "hs_2.safetensors").exists()


def test_padding_alone_is_not_an_error():
    """Positions past a sample's length are padding, never written: non-finite values there pass."""
    hs = torch.zeros(2, 5, 3, 4)
    hs[1, 3:] = float("nan")  # sample 1 holds 3 real tokens
    finite.check_batch(hs, [5, 3], [10, 11], [1, 2, 4])
    hs[1, 2, 2, 0] = float("-inf")
    with pytest.raises(finite.NonFinite, match=r"sample 11 at layer 4: 0 NaN and 1 Inf values, the first at token 2"):
        finite.check_batch(hs, [5, 3], [10, 11], [1, 2, 4])


def test_the_supervisor_reads_the_line_as_a_failure_naming_sample_and_layer():
    from probe_helpers import events_of

    line = ("extract error: non-finite hidden states in sample 5 at layer 1: 0 NaN and 64 Inf values, the first at "
            "token 0; also in layers 2, 4; nothing of that sample was written")
    [ev] = [e for e in events_of([line]) if e.probe == "extract.nonfinite"]
    assert ev.kind.value == "failure" and ev.fields["sample"] == 5 and ev.fields["layer"] == 1
