"""eagle3.regenerate: the target answers the prompts itself (greedy, its chat template), the answers are
written as token_ids + an assistant-only loss mask, and eagle3.extract takes them as they are."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from extract_helpers import REPO, build_test_model, cli_env, run_main  # noqa: E402
from eagle3 import regenerate  # noqa: E402

RECORDS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Written by someone else."}]},
    {"prompt": "Write a haiku about rain."},
    {"token_ids": [1, 5, 9, 13]},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


def test_answers_are_the_target_s_greedy_continuation_and_extract_takes_them(model, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "regen.jsonl"
    proc = subprocess.run([sys.executable, "-m", "eagle3.regenerate", "--model", str(model), "--prompts",
                           str(prompts), "--out", str(out), "--max-new-tokens", "12"], cwd=REPO, env=cli_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "regenerate: 3 answers, " in proc.stdout
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 3

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    chat = tok(tok.apply_chat_template(RECORDS[0]["messages"][:1], tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    expected_prompts = [chat, tok("Write a haiku about rain.")["input_ids"], RECORDS[2]["token_ids"]]
    for rec, p in zip(recs, expected_prompts):
        ids, mask = rec["token_ids"], rec["loss_mask"]
        n = len(p)
        assert ids[:n] == p and mask == [0] * n + [1] * (len(ids) - n) and len(ids) > n
        # Teacher-forced argmax of the target over the whole record: every answer token is what greedy
        # decoding picks after the tokens before it.
        with torch.no_grad():
            arg = lm(torch.tensor([ids])).logits[0].argmax(-1).tolist()
        assert arg[n - 1:len(ids) - 1] == ids[n:]
    # The other model's answer is gone from the training text.
    assert "someone else" not in tok.decode(recs[0]["token_ids"])

    data = tmp_path / "extract"
    rc, text = run_main(capsys, ["--model", model, "--prompts", out, "--out", data, "--device", "cpu"])
    assert rc == 0, text
    from safetensors.torch import load_file

    prepared = load_file(str(data / "prepared.safetensors"))
    assert prepared["loss_mask"].sum().item() == sum(sum(r["loss_mask"]) for r in recs)


@pytest.mark.parametrize("case", ["tokens", "model", "prompts"])
def test_refusals_are_one_line_exit_78(model, tmp_path, capsys, case):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hi."}\n' if case != "prompts" else '{"nothing": 1}\n')
    argv = ["--model", str(model if case != "model" else tmp_path / "none"), "--prompts", str(prompts),
            "--out", str(tmp_path / "o.jsonl")]
    if case == "tokens":
        argv += ["--max-new-tokens", "0"]
    assert regenerate.main(argv) == 78
    text = capsys.readouterr().out
    assert text.count("\n") == 1 and text.startswith("regenerate error: ")
    assert not (tmp_path / "o.jsonl").exists()


def test_the_shipped_pipeline_extracts_what_regenerate_wrote():
    from pathlib import Path

    from supervisor.spec.pipeline import load_pipeline, resolve

    path = Path(REPO) / "jobs" / "eagle3-regen.toml"
    steps = {s.step: s.spec.argv(1) for s in resolve(load_pipeline(path), path, {}).steps}
    assert list(steps) == ["regenerate", "extract", "train"]
    regen_out = steps["regenerate"][steps["regenerate"].index("--out") + 1]
    assert steps["extract"][steps["extract"].index("--prompts") + 1] == regen_out
    extract_out = steps["extract"][steps["extract"].index("--out") + 1]
    assert steps["train"][steps["train"].index("--data") + 1] == extract_out
