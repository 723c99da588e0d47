"""Prompt set → token ids and loss masks.

Input: a JSONL file, one record per non-blank line, either

* ``{"prompt": "..."}``: a plain prompt, tokenised with the tokenizer's own special tokens
  (e.g. a leading BOS); its loss mask is all ones (every position is a training target);
* ``{"token_ids": [...]}`` (optionally with ``"loss_mask": [...]`` of the same length, default all
  ones): tokens given as they are, for models that ship no tokenizer;
* ``{"messages": [{"role": "...", "content": "..."}, ...]}``: a chat, rendered with the
  tokenizer's chat template and tokenised without adding special tokens (the template has them);
  its loss mask is 1 on the tokens of each assistant message's content, plus the one token right
  after that content when it is a special token (the end-of-turn marker, e.g. ``<|eot_id|>``),
  and 0 everywhere else (system and user turns, role headers, BOS).

Sample ``i`` is the i-th record of the file (blank lines do not count), so an index names the
same sample on every run. Samples longer than ``max_seq_len`` are cut to their first
``max_seq_len`` tokens (mask cut alike).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


class PromptSetError(ValueError):
    """A record of the prompt set is malformed."""


@dataclass
class Sample:
    index: int
    kind: str  # "prompt" | "chat" | "tokens"
    token_ids: list[int]
    loss_mask: list[int]
    truncated: bool

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)


def load_records(path: str | os.PathLike[str], max_samples: int | None = None) -> list[dict[str, Any]]:
    """Read and validate the JSONL prompt set; errors name the file and line."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if max_samples is not None and len(records) >= max_samples:
                break
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise PromptSetError(f"{path}:{lineno}: not valid JSON: {e}") from None
            _validate(rec, f"{path}:{lineno}")
            records.append(rec)
    if not records:
        raise PromptSetError(f"{path}: no records")
    return records


def _validate(rec: Any, where: str) -> None:
    if not isinstance(rec, dict) or sum(k in rec for k in ("prompt", "messages", "token_ids")) != 1:
        raise PromptSetError(f"{where}: a record needs exactly one of 'prompt', 'messages' or 'token_ids'")
    if "token_ids" in rec:
        ids, mask = rec["token_ids"], rec.get("loss_mask")
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise PromptSetError(f"{where}: 'token_ids' must be a non-empty list of non-negative integers")
        if mask is not None and not (isinstance(mask, list) and len(mask) == len(ids)
                                     and all(m in (0, 1) for m in mask)):
            raise PromptSetError(f"{where}: 'loss_mask' must be a list of 0/1 as long as 'token_ids'")
        return
    if "prompt" in rec:
        if not isinstance(rec["prompt"], str) or not rec["prompt"]:
            raise PromptSetError(f"{where}: 'prompt' must be a non-empty string")
        return
    msgs = rec["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise PromptSetError(f"{where}: 'messages' must be a non-empty list")
    for j, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise PromptSetError(f"{where}: message {j} needs string 'role' and 'content'")


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    try:
        ids.update(tokenizer.added_tokens_decoder.keys())  # added tokens such as <|eot_id|>
    except AttributeError:
        pass
    return ids


def tokenize_record(rec: dict[str, Any], tokenizer: Any, *, index: int = 0,
                    warn: Any = None) -> tuple[str, list[int], list[int]]:
    """(kind, token_ids, loss_mask) of one record, before truncation."""
    if "token_ids" in rec:
        ids = [int(t) for t in rec["token_ids"]]
        return "tokens", ids, [int(m) for m in rec.get("loss_mask") or [1] * len(ids)]
    if tokenizer is None:
        raise PromptSetError(f"sample {index}: text records need the model's tokenizer, and none was found")
    if "prompt" in rec:
        ids = list(tokenizer(rec["prompt"], add_special_tokens=True)["input_ids"])
        return "prompt", ids, [1] * len(ids)

    messages = rec["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    # Character spans of each assistant message's content in the rendered text.
    spans: list[tuple[int, int]] = []
    cursor = 0
    for j, m in enumerate(messages):
        content = m["content"]
        for needle in (content, content.strip()):
            pos = text.find(needle, cursor) if needle else -1
            if pos >= 0:
                if m["role"] == "assistant":
                    spans.append((pos, pos + len(needle)))
                cursor = pos + len(needle)
                break
        else:
            if m["role"] == "assistant" and warn is not None:
                warn(f"sample {index}: assistant message {j} is not in the rendered chat verbatim; "
                     "its tokens are left out of the loss mask")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = enc["offset_mapping"]
    special = _special_ids(tokenizer)
    mask = [0] * len(ids)
    for s, e in spans:
        last = -1
        for t, (a, b) in enumerate(offsets):
            if a < e and b > s and b > a:
                mask[t] = 1
                last = t
        if last >= 0 and last + 1 < len(ids) and ids[last + 1] in special:
            mask[last + 1] = 1
    return "chat", ids, mask


def prepare(records: Sequence[dict[str, Any]], tokenizer: Any, max_seq_len: int,
            warn: Any = None) -> list[Sample]:
    """Tokenise every record; sample ``i`` is ``records[i]``."""
    if max_seq_len < 1:
        raise ValueError("max_seq_len must be at least 1")
    samples = []
    for i, rec in enumerate(records):
        kind, ids, mask = tokenize_record(rec, tokenizer, index=i, warn=warn)
        if not ids:
            raise PromptSetError(f"sample {i}: tokenises to no tokens")
        truncated = len(ids) > max_seq_len
        samples.append(Sample(i, kind, ids[:max_seq_len], mask[:max_seq_len], truncated))
    return samples


def token_frequencies(samples: Iterable[Sample], vocab_size: int):
    """(masked, all): int64 counts per token id, over loss-masked tokens and over all tokens."""
    import torch

    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    for s in samples:
        ids = torch.tensor(s.token_ids, dtype=torch.int64)
        m = torch.tensor(s.loss_mask, dtype=torch.bool)
        every += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
        masked += torch.bincount(ids[m], minlength=vocab_size)[:vocab_size]
    return masked, every


def packed(samples: Sequence[Sample]) -> dict[str, Any]:
    """The prepared data as tensors: concatenated ids and masks plus offsets [N+1]."""
    import torch

    offsets = [0]
    for s in samples:
        offsets.append(offsets[-1] + s.seq_len)
    return {
        "token_ids": torch.tensor([t for s in samples for t in s.token_ids], dtype=torch.int64),
        "loss_mask": torch.tensor([t for s in samples for t in s.loss_mask], dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }


def data_digest(samples: Sequence[Sample]) -> str:
    """sha256 over every sample's token ids and loss mask (identifies the prepared data)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.token_ids, s.loss_mask], separators=(",", ":")).encode())
    return h.hexdigest()


def needs_tokenizer(records: Iterable[dict[str, Any]]) -> bool:
    return any("token_ids" not in r for r in records)
