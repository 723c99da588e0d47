"""The target answers the prompts itself, and the answers become the training set:
``PYTHONPATH=jobs python -m eagle3.regenerate --model M --prompts IN.jsonl --out OUT.jsonl
[--backend hf|vllm] [--max-new-tokens N]``, then ``eagle3.extract --prompts OUT.jsonl``.

A draft learns to predict the target's own continuations; trained on answers some other model wrote, it
learns text the target would not produce and acceptance suffers (speculators and SpecForge both regenerate
the responses before extraction). Each record of the prompt set becomes the conversation up to its last
user turn (its assistant turns after that are dropped), rendered with the model's chat template and a
generation prompt (``enable_thinking=True`` is passed, so a template with a thinking switch thinks), and the
target continues it greedily until its end-of-sequence token or ``--max-new-tokens``. ``prompt`` records are
continued as they are tokenised; ``token_ids`` records as given.

The output is written as ``token_ids`` records with their ``loss_mask``: 0 on the prompt, 1 on every
generated token, the end-of-turn token included. Writing ids rather than text keeps the answer (its thinking
too) exactly as the target produced it: a template that strips reasoning when it re-renders an assistant
turn cannot drop it, and re-tokenising cannot split it differently. That is the assistant-only loss mask.

Backends: ``hf`` (transformers ``generate``, greedy; CPU tests use it) and ``vllm`` (``LLM.generate`` on
token-id prompts, temperature 0). The file is written whole (temporary name, rename). Lines:
``regenerate: {n} answers, {tokens} tokens generated, {tok_s} tok/s, {ended} ended by the model``; a
malformed prompt set or missing model is one line, exit 78.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _io
from . import data as data_mod

EXIT_CONFIG = 78


class RegenerateError(ValueError):
    """The prompt set or model cannot be used."""


@dataclass
class Answer:
    prompt_ids: list[int]
    answer_ids: list[int]
    ended: bool  # the model stopped by itself (end of sequence) rather than at --max-new-tokens

    def record(self) -> dict[str, Any]:
        return {"token_ids": self.prompt_ids + self.answer_ids,
                "loss_mask": [0] * len(self.prompt_ids) + [1] * len(self.answer_ids)}


def prompt_ids(rec: dict[str, Any], tokenizer: Any) -> list[int]:
    """Token ids the target continues for one record of the prompt set."""
    if "token_ids" in rec:
        return [int(t) for t in rec["token_ids"]]
    if tokenizer is None:
        raise RegenerateError("text records need the model's tokenizer, and none was found")
    if "prompt" in rec:
        return list(tokenizer(rec["prompt"], add_special_tokens=True)["input_ids"])
    msgs = list(rec["messages"])
    last_user = max((j for j, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    if last_user < 0:
        raise RegenerateError("a messages record has no user turn to answer")
    text = tokenizer.apply_chat_template(msgs[:last_user + 1], tokenize=False, add_generation_prompt=True,
                                         enable_thinking=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_ids(tokenizer: Any, config: dict[str, Any]) -> set[int]:
    """End-of-sequence ids: the config's (one or a list), the tokenizer's."""
    out: set[int] = set()
    for v in (config.get("eos_token_id"), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(v, int):
            out.add(v)
        elif isinstance(v, list):
            out.update(int(x) for x in v)
    return out


def generate_hf(model_dir: str, prompts: Sequence[list[int]], max_new: int, stops: set[int],
                device: str = "cpu") -> list[list[int]]:
    import torch

    from .hf_backend import load_model

    model = load_model(model_dir, device, "float32" if device == "cpu" else "auto")
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                               eos_token_id=sorted(stops) or None, pad_token_id=(sorted(stops) or [0])[0])
        out.append([int(t) for t in y[0, len(ids):]])
    return out


def generate_vllm(model_dir: str, prompts: Sequence[list[int]], max_new: int, stops: set[int],
                  max_model_len: int) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, max_model_len=max_model_len, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, stop_token_ids=sorted(stops))
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def regenerate(args: argparse.Namespace) -> tuple[list[Answer], float]:
    if not args.model:  # the embedded tiny model, built as eagle3.extract builds it (the same directory)
        from .tiny_model import build, default_model_dir

        args.model = str(build(default_model_dir(args.cache_dir)))
    model_dir = Path(args.model)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        raise RegenerateError(f"--model {model_dir}: no readable config.json (a local model directory)") from None
    try:
        records = data_mod.load_records(args.prompts, args.max_samples)
    except (OSError, data_mod.PromptSetError) as e:
        raise RegenerateError(f"--prompts: {e}") from None
    tokenizer = None
    if data_mod.needs_tokenizer(records):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    prompts = [prompt_ids(r, tokenizer) for r in records]
    stops = stop_ids(tokenizer, config)
    t0 = time.monotonic()
    if args.backend == "hf":
        answers = generate_hf(str(model_dir), prompts, args.max_new_tokens, stops, args.device)
    else:
        longest = max(len(p) for p in prompts) + args.max_new_tokens
        answers = generate_vllm(str(model_dir), prompts, args.max_new_tokens, stops, longest)
    seconds = time.monotonic() - t0
    out = []
    for p, a in zip(prompts, answers):
        # An answer the model ended keeps its end-of-sequence token (in the loss mask): the draft must
        # learn to propose it. Anything past it (hf pads finished rows) is dropped.
        cut = next((k + 1 for k, t in enumerate(a) if t in stops), None)
        out.append(Answer(p, a[:cut] if cut else a, cut is not None))
    return out, seconds


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.regenerate",
                                 description="Have the target answer the prompts; write them for eagle3.extract.")
    ap.add_argument("--model", default="", help="the target's local model directory (empty: the embedded tiny "
                                                "model, built into --cache-dir as eagle3.extract builds it)")
    ap.add_argument("--cache-dir", default="", help="where the embedded tiny model is built")
    ap.add_argument("--prompts", required=True, help="JSONL prompt set (prompt, messages or token_ids records)")
    ap.add_argument("--out", required=True, help="JSONL of token_ids + loss_mask records to write")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--max-samples", type=int)
    ap.add_argument("--device", default="cpu", help="hf backend: cpu or cuda")
    args = ap.parse_args(argv)
    try:
        if args.max_new_tokens < 1:
            raise RegenerateError(f"--max-new-tokens {args.max_new_tokens}: at least 1")
        answers, seconds = regenerate(args)
    except RegenerateError as e:
        print(f"regenerate error: {e}", flush=True)
        return EXIT_CONFIG
    body = "".join(json.dumps(a.record()) + "\n" for a in answers)
    _io.atomic_write_bytes(body.encode(), args.out)
    tokens = sum(len(a.answer_ids) for a in answers)
    print(f"regenerate: {len(answers)} answers, {tokens} tokens generated, {tokens / max(seconds, 1e-9):.1f} tok/s, "
          f"{sum(a.ended for a in answers)} ended by the model", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
