"""Data preparation of the extraction job: records, chat template, loss mask, truncation, frequencies."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import PROMPTS, build_test_model

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import data


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_test_model(tmp_path_factory.getbasetemp()))


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_shipped_prompt_set_mixes_prompts_and_chats_of_varied_length(tokenizer):
    records = data.load_records(PROMPTS)
    assert 56 <= len(records) <= 72
    kinds = {"prompt": 0, "messages": 0}
    for r in records:
        kinds["prompt" if "prompt" in r else "messages"] += 1
    assert kinds["prompt"] >= 16 and kinds["messages"] >= 16
    lens = [s.seq_len for s in data.prepare(records, tokenizer, 4096)]
    assert min(lens) < 10 and max(lens) > 200


def test_plain_prompt_gets_bos_and_all_ones_mask(tokenizer):
    [s] = data.prepare([{"prompt": "Hello there, world."}], tokenizer, 100)
    assert s.kind == "prompt"
    assert s.token_ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(s.token_ids[1:]) == "Hello there, world."
    assert s.loss_mask == [1] * s.seq_len


def test_chat_mask_covers_assistant_content_and_end_of_turn_only(tokenizer):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "Four."},
            {"role": "user", "content": "And three plus three?"},
            {"role": "assistant", "content": "Six, of course."}]
    [s] = data.prepare([{"messages": msgs}], tokenizer, 1000)
    assert s.kind == "chat"
    # The token ids are exactly the chat template's rendering, BOS once.
    rendered = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert tokenizer.decode(s.token_ids) == rendered
    assert s.token_ids.count(tokenizer.bos_token_id) == 1
    # Masked tokens, taken in runs, are each assistant message followed by <|eot_id|>.
    runs, cur = [], []
    for t, m in zip(s.token_ids, s.loss_mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert [tokenizer.decode(r) for r in runs] == ["Four.<|eot_id|>", "Six, of course.<|eot_id|>"]


def test_chat_without_assistant_turn_has_empty_mask(tokenizer):
    [s] = data.prepare([{"messages": [{"role": "user", "content": "Hi?"}]}], tokenizer, 100)
    assert s.seq_len > 3 and sum(s.loss_mask) == 0


def test_truncation_keeps_the_first_tokens_and_cuts_the_mask_alike(tokenizer):
    rec = {"messages": [{"role": "user", "content": "Tell me a long story."},
                        {"role": "assistant", "content": "Once upon a time " * 30}]}
    [full] = data.prepare([rec], tokenizer, 10_000)
    [cut] = data.prepare([rec], tokenizer, 20)
    assert not full.truncated and cut.truncated
    assert cut.token_ids == full.token_ids[:20] and cut.loss_mask == full.loss_mask[:20]


def test_token_id_records_need_no_tokenizer():
    recs = [{"token_ids": [5, 6, 7]}, {"token_ids": [1, 2], "loss_mask": [0, 1]}]
    a, b = data.prepare(recs, None, 2)
    assert (a.kind, a.token_ids, a.loss_mask, a.truncated) == ("tokens", [5, 6], [1, 1], True)
    assert (b.token_ids, b.loss_mask) == ([1, 2], [0, 1])
    assert not data.needs_tokenizer(recs)
    with pytest.raises(data.PromptSetError, match="tokenizer"):
        data.prepare([{"prompt": "x"}], None, 8)


def test_indices_follow_record_order_skipping_blank_lines_and_max_samples(tmp_path, tokenizer):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n   \n{"prompt": "c"}\n')
    recs = data.load_records(p)
    assert [r["prompt"] for r in recs] == ["a", "b", "c"]
    assert [s.index for s in data.prepare(recs, tokenizer, 8)] == [0, 1, 2]
    assert [r["prompt"] for r in data.load_records(p, max_samples=2)] == ["a", "b"]
    # Same input, same samples: the digest is stable.
    assert data.data_digest(data.prepare(recs, tokenizer, 8)) == data.data_digest(data.prepare(recs, tokenizer, 8))


@pytest.mark.parametrize("line, msg", [
    ("not json", "not valid JSON"),
    ('{"prompt": "a", "messages": []}', "exactly one"),
    ('{"prompt": ""}', "non-empty string"),
    ('{"messages": [{"role": "user"}]}', "message 0"),
    ('{"token_ids": [1, -2]}', "non-negative"),
    ('{"token_ids": [1, 2], "loss_mask": [1]}', "as long as"),
])
def test_malformed_records_name_file_and_line(tmp_path, line, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(data.PromptSetError, match=msg) as ei:
        data.load_records(p)
    assert f"{p}:2" in str(ei.value)


def test_token_frequencies_count_masked_and_all_tokens():
    samples = data.prepare([{"token_ids": [1, 2, 2], "loss_mask": [0, 1, 1]}, {"token_ids": [2, 3]}], None, 10)
    masked, every = data.token_frequencies(samples, 5)
    assert masked.tolist() == [0, 0, 3, 1, 0]
    assert every.tolist() == [0, 1, 3, 1, 0]
    packed = data.packed(samples)
    assert packed["offsets"].tolist() == [0, 3, 5]
    assert packed["token_ids"].tolist() == [1, 2, 2, 2, 3]
    assert packed["loss_mask"].tolist() == [0, 1, 1, 1, 1]
