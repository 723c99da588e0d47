"""eagle3.regenerate: the target answers the prompts itself (greedy, its chat template), the answers are
written as token_ids + an assistant-only loss mask, and eagle3.extract takes them as they are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from extract_helpers import REPO, build_test_model, cli_env, run_main

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import regenerate

RECORDS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Written by someone else."}]},
    {"prompt": "Write a haiku about rain."},
    {"token_ids": [1, 5, 9, 13]},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


@pytest.mark.timeout(600)  # a model load and generation in a child: 8 s idle, 31 s beside 6 busy loops, >120 at load 10
def test_answers_are_the_target_s_greedy_continuation_and_extract_takes_them(model, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "regen.jsonl"
    proc = subprocess.run([sys.executable, "-m", "eagle3.regenerate", "--model", str(model), "--prompts",
                           str(prompts), "--out", str(out), "--max-new-tokens", "12"], cwd=REPO, env=cli_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=500)
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
    for rec, p in zip(recs, expected_prompts, strict=True):
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


BAD_VALUES = {
    "tokens": ["--max-new-tokens", "0"],
    "temperature": ["--temperature", "-0.5"],
    "top_p_zero": ["--temperature", "0.7", "--top-p", "0"],
    "top_p_above_one": ["--temperature", "0.7", "--top-p", "1.5"],
    "shard_past_the_end": ["--shard", "2", "--num-shards", "2"],
    "no_shards": ["--num-shards", "0"],
    "batch_size": ["--batch-size", "0"],
    "fsync_every": ["--fsync-every", "0"],
}


@pytest.mark.parametrize("case", [*BAD_VALUES, "model", "prompts"])
def test_refusals_are_one_line_exit_78(model, tmp_path, capsys, case):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hi."}\n' if case != "prompts" else '{"nothing": 1}\n')
    argv = ["--model", str(model if case != "model" else tmp_path / "none"), "--prompts", str(prompts),
            "--out", str(tmp_path / "o.jsonl"), *BAD_VALUES.get(case, [])]
    assert regenerate.main(argv) == 78
    text = capsys.readouterr().out
    assert text.count("\n") == 1 and text.startswith("regenerate error: ")
    if case in BAD_VALUES:  # the line names the flag to change
        assert BAD_VALUES[case][-2] in text, text
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "o.jsonl.parts").exists()  # nothing begun


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


def _regen(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eagle3.regenerate", *args], cwd=REPO, env=cli_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(p: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out
    return out


N_KILL = 8
SAMPLED = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "3"]


@pytest.fixture(scope="module")
def uninterrupted(model, tmp_path_factory):
    """What one launch writes: uninterrupted(mode) -> bytes, made once per mode (greedy, sampled)."""
    from extract_helpers import PROMPTS

    base = tmp_path_factory.mktemp("regen-ref")
    got: dict[str, bytes] = {}

    def make(mode: str) -> bytes:
        if mode not in got:
            out = base / f"{mode}.jsonl"
            _finish(_regen(["--model", str(model), "--prompts", str(PROMPTS), "--out", str(out), "--max-samples",
                            str(N_KILL), "--max-new-tokens", "12", *(SAMPLED if mode == "sampled" else [])]))
            got[mode] = out.read_bytes()
        return got[mode]
    return make


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_sigkill_mid_run_then_relaunch_gives_the_uninterrupted_file(model, tmp_path, uninterrupted, mode):
    import os
    import signal
    import time

    from extract_helpers import PROMPTS

    out = tmp_path / "regen.jsonl"
    args = ["--model", str(model), "--prompts", str(PROMPTS), "--out", str(out), "--max-samples", str(N_KILL),
            "--max-new-tokens", "12", *([*SAMPLED, "--fsync-every", "2"] if mode == "sampled" else [])]
    p = _regen(args, EAGLE3_FAULT_BATCH_DELAY_S="0.3")
    seen: list[str] = []
    deadline = time.monotonic() + 240
    try:
        for line in p.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("regenerate progress: 3/8 answers"):
                os.killpg(p.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, seen
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()
    assert p.returncode == -signal.SIGKILL, seen  # killed mid-run, on its progress line
    assert not out.exists()  # nothing assembled yet; the answers so far are in the journal
    relaunch = _finish(_regen(args))
    m = re.search(r"^regenerate resume: (\d+)/8 answers already done$", relaunch, re.M)
    assert m and 3 <= int(m.group(1)) < 8, relaunch  # what was appended before the kill is kept
    assert "regenerate progress: 8/8 answers" in relaunch
    assert out.read_bytes() == uninterrupted(mode)
    if mode == "sampled":
        assert uninterrupted("sampled") != uninterrupted("greedy")  # the sampling settings reach the model
    # Done: a further relaunch generates nothing and writes the same file.
    again = _finish(_regen(args))
    assert "regenerate resume: 8/8 answers already done" in again and "phase: model_init" not in again
    assert out.read_bytes() == uninterrupted(mode)


@pytest.mark.timeout(600)
def test_shards_each_answer_their_prompts_and_the_last_assembles_the_file(model, tmp_path, uninterrupted):
    from extract_helpers import PROMPTS

    out = tmp_path / "regen.jsonl"
    base = ["--model", str(model), "--prompts", str(PROMPTS), "--out", str(out), "--max-samples", str(N_KILL),
            "--max-new-tokens", "12", "--num-shards", "2"]
    first = _finish(_regen([*base, "--shard", "1"]))
    assert "regenerate: 4 answers" in first and f"shard 1 of 2 done; {out} is written once every shard is" in first
    assert not out.exists()
    r = subprocess.run([sys.executable, "-m", "eagle3.regenerate", "gather", "--out", str(out), "--num-shards", "2"],
                       cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and r.stdout.startswith("regenerate gather refused: shard(s) 0 of 2"), r.stdout
    _finish(_regen([*base, "--shard", "0"]))
    assert out.read_bytes() == uninterrupted("greedy")
    out.unlink()
    r = subprocess.run([sys.executable, "-m", "eagle3.regenerate", "gather", "--out", str(out), "--num-shards", "2"],
                       cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and out.read_bytes() == uninterrupted("greedy"), r.stdout


def test_a_relaunch_with_other_sampling_settings_is_refused(model, tmp_path, capsys):
    from extract_helpers import PROMPTS

    args = ["--model", str(model), "--prompts", str(PROMPTS), "--out", str(tmp_path / "o.jsonl"), "--max-samples",
            "2", "--max-new-tokens", "4"]
    assert regenerate.main(args) == 0
    capsys.readouterr()
    assert regenerate.main([*args, "--temperature", "0.5"]) == 78
    text = capsys.readouterr().out
    assert text.count("\n") == 1 and "holds answers made with other settings (differs in: sampling)" in text


def test_the_supervisor_follows_the_progress_line_as_a_bar():
    from probe_helpers import events_of

    evs = events_of(["regenerate phase: generating", "regenerate progress: 3/8 answers, 12.5 tok/s",
                     "regenerate: 8 answers, 96 tokens generated, 9.0 tok/s, 0 ended by the model"])
    [bar] = [e for e in evs if e.probe == "regenerate.answers"]
    assert bar.kind.value == "progress" and (bar.fields["done"], bar.fields["total"]) == (3, 8)
    assert bar.fields["unit"] == "answers"
    assert [e.phase.value for e in evs if e.probe == "regenerate.done"] == ["done"]


@pytest.mark.parametrize("first, step", [
    ("regenerate phase: generating", "regenerate progress: {k}/8 answers, 10.0 tok/s"),
    ("vllm loading", "Loading safetensors checkpoint shards: {k}0% Completed | {k}/8 [00:0{k}<00:04, 1.00s/it]"),
])
def test_answers_that_stop_coming_are_judged_stalled_as_a_stalled_load_is(first, step):
    """The regeneration's bar and a weight-loading bar, paced alike and stopped alike, on an injected clock:
    the same verdict at the same moment, from the same bound."""
    from probe_helpers import events_of

    from supervisor.core.events import Verdict
    from supervisor.jobs.runner._watching import _from_probe
    from supervisor.spec.model import HealthSpec
    from supervisor.watchdog import Watchdog

    w = Watchdog(HealthSpec(stall_floor_s=3, silence_s=None), clock=lambda: 0.0, started_at=0.0)
    for at, lines in [(0.0, [first]), *((float(k), [step.format(k=k)]) for k in range(1, 5))]:
        w.output_seen(at)
        for pe in events_of(lines):
            w.observe(_from_probe("j", 1, pe), at)
    assert w.check(6.9).verdict is Verdict.HEALTHY  # a step a second, the last at 4 s
    judged = w.check(7.0)
    assert judged.verdict is Verdict.STALLED and "no progress for 3.0s (bound 3.0s = stall_floor_s" in judged.reason
    assert judged.reason.startswith("answer 4/8," if first.startswith("regenerate") else "shard 4/8 ")


@pytest.mark.timeout(600)  # two shard processes and a gather under a real daemon: a model load each, on 2 busy cores
def test_supervise_start_regenerate_with_shards_then_gather_writes_the_uninterrupted_file(
        model, uninterrupted, daemon, home):
    """`supervise start regenerate --shards 2` through the shipped spec: each shard gets its --shard/--num-shards,
    the spec's gather assembles OUT, and OUT is what one unsharded launch writes."""
    from conftest import wait_until
    from extract_helpers import PROMPTS

    from supervisor.core.events import JobState
    from supervisor.core.overrides import FieldOverrides

    prompts = home / "prompts-8.jsonl"
    prompts.write_text("".join(PROMPTS.read_text().splitlines(keepends=True)[:N_KILL]))
    out = home / "out" / "regen.jsonl"
    client = daemon.client()
    client.start(str(REPO / "jobs" / "regenerate.toml"),
                 {"model": str(model), "prompts": str(prompts), "out": str(out), "max_new_tokens": "12"},
                 fields=FieldOverrides(shards=2))

    def ended():
        st = client.status("regenerate").jobs[0]
        return st if st.state in (JobState.DONE, JobState.FAILED, JobState.STOPPED) else None

    st = wait_until(ended, timeout=500)
    assert st.state is JobState.DONE, st
    attempts = client.attempts("regenerate").attempts
    logs = {a.shard: Path(a.log_path).read_text() for a in attempts if a.shard is not None and a.shard >= 0}
    assert sorted(logs) == [0, 1] and all("regenerate: 4 answers" in t for t in logs.values()), logs
    assert sorted(p.name for p in (out.parent / "regen.jsonl.parts").iterdir()) == [
        "shard-0-of-2.jsonl", "shard-1-of-2.jsonl"]
    assert out.read_bytes() == uninterrupted("greedy")
