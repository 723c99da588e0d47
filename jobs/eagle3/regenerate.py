"""The target answers the prompts itself, and the answers become the training set:
``PYTHONPATH=jobs python -m eagle3.regenerate --model M --prompts IN.jsonl --out OUT.jsonl
[--backend hf|vllm] [--max-new-tokens N] [--temperature T --top-p P --seed S] [--shard I --num-shards N]``,
then ``eagle3.extract --prompts OUT.jsonl``.

A draft learns to predict the target's own continuations; trained on answers some other model wrote, it
learns text the target would not produce and acceptance suffers (speculators and SpecForge both regenerate
the responses before extraction). Each record of the prompt set becomes the conversation up to its last
user turn (its assistant turns after that are dropped), rendered with the model's chat template and a
generation prompt (``enable_thinking=True`` is passed, so a template with a thinking switch thinks), and the
target continues it until its end-of-sequence token or ``--max-new-tokens``. ``prompt`` records are
continued as they are tokenised; ``token_ids`` records as given.

Sampling: greedy by default (``--temperature 0``); with a temperature, nucleus sampling (``--top-p``) seeded
per prompt (``--seed`` + the prompt's index), so an answer does not depend on which launch, shard or batch
produced it: a relaunch gives the answers an uninterrupted run gives (as speculators' and SpecForge's
regeneration scripts offer: temperature, top-p, max tokens, seed).

The output is written as ``token_ids`` records with their ``loss_mask``: 0 on the prompt, 1 on every
generated token, the end-of-turn token included. Writing ids rather than text keeps the answer (its thinking
too) exactly as the target produced it: a template that strips reasoning when it re-renders an assistant
turn cannot drop it, and re-tokenising cannot split it differently. That is the assistant-only loss mask.

Resuming (``eagle3.answers``): each answer is appended to this shard's journal as it completes (fsynced every
``--fsync-every`` answers); a relaunch skips the prompts answered. Sharding: prompt i belongs to shard
i mod N; ``OUT`` is assembled in prompt order once every prompt has its answer (by the shard that finishes
last, or by ``python -m eagle3.regenerate gather --out OUT --num-shards N``).

Backends: ``hf`` (transformers ``generate``, one prompt at a time; CPU tests use it) and ``vllm``
(``LLM.generate`` on token-id prompts, ``--batch-size`` prompts a call). Lines:
``regenerate phase: model_init|generating``; ``regenerate resume: {k}/{n} answers already done``;
``regenerate progress: {done}/{n} answers, {tok_s} tok/s`` as answers are appended (the supervisor's bar);
``regenerate: {n} answers, {tokens} tokens generated, {tok_s} tok/s, {ended} ended by the model`` at the end.
A malformed prompt set, a missing model, a journal of other settings or a second process on the same shard
is one line, exit 78.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import _io, answers
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


@dataclass(frozen=True)
class Sampling:
    """How the target continues a prompt; part of the journal's fingerprint."""

    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise RegenerateError(f"--max-new-tokens {self.max_new_tokens}: at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise RegenerateError(f"--temperature {self.temperature} / --top-p {self.top_p}: a temperature of 0 "
                                  "or more and a top-p in (0, 1]")


def generate_hf(model_dir: str, items: Sequence[tuple[int, list[int]]], sampling: Sampling, stops: set[int],
                device: str = "cpu") -> Iterator[tuple[int, list[int]]]:
    """(prompt index, generated ids) as each answer completes."""
    import torch

    from .hf_backend import load_model

    model = load_model(model_dir, device, "float32" if device == "cpu" else "auto")
    sample = sampling.temperature > 0
    extra = {"temperature": sampling.temperature, "top_p": sampling.top_p} if sample else {}
    for index, ids in items:
        torch.manual_seed(sampling.seed + index)  # per prompt: the same answer whichever launch makes it
        x = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=sampling.max_new_tokens,
                               do_sample=sample, eos_token_id=sorted(stops) or None,
                               pad_token_id=(sorted(stops) or [0])[0], **extra)
        yield index, [int(t) for t in y[0, len(ids):]]


def generate_vllm(model_dir: str, items: Sequence[tuple[int, list[int]]], sampling: Sampling, stops: set[int],
                  max_model_len: int, batch_size: int) -> Iterator[tuple[int, list[int]]]:
    """(prompt index, generated ids), a batch of ``batch_size`` prompts at a time."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, max_model_len=max_model_len, enable_prefix_caching=False)
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        params = [SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=sampling.max_new_tokens, stop_token_ids=sorted(stops),
                                 seed=sampling.seed + index) for index, _ in chunk]
        outs = llm.generate([{"prompt_token_ids": list(p)} for _, p in chunk], params)
        for (index, _), o in zip(chunk, outs, strict=True):
            yield index, list(o.outputs[0].token_ids)


def say(line: str) -> None:
    print(line, flush=True)


def cut_answer(prompt: list[int], generated: list[int], stops: set[int]) -> Answer:
    # An answer the model ended keeps its end-of-sequence token (in the loss mask): the draft must
    # learn to propose it. Anything past it (hf pads finished rows) is dropped.
    cut = next((k + 1 for k, t in enumerate(generated) if t in stops), None)
    return Answer(prompt, generated[:cut] if cut else generated, cut is not None)


def fingerprint(model_dir: Path, prompts: Sequence[list[int]], sampling: Sampling) -> dict[str, Any]:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p).encode() + b"\n")
    model = hashlib.sha256((model_dir / "config.json").read_bytes())
    marker = model_dir / "tiny_model.json"
    if marker.is_file():  # the embedded model: its build fingerprint names the weights' seed
        model.update(json.loads(marker.read_text()).get("fingerprint", "").encode())
    return {"prompts_sha256": h.hexdigest(), "model_sha256": model.hexdigest(), "sampling": asdict(sampling)}


@dataclass
class Setup:
    model_dir: Path
    prompts: list[list[int]]
    stops: set[int]
    fingerprint: dict[str, Any]


def setup(args: argparse.Namespace) -> Setup:
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
    return Setup(model_dir, prompts, stop_ids(tokenizer, config), fingerprint(model_dir, prompts, args.sampling))


def regenerate(args: argparse.Namespace) -> int:
    su = setup(args)
    out = Path(args.out)
    total = len(su.prompts)
    journal = answers.Journal(answers.journal_path(out, args.shard, args.num_shards), su.fingerprint,
                              args.fsync_every)
    try:
        done = journal.open()
    except answers.JournalError as e:
        raise RegenerateError(str(e)) from None
    mine = len(range(args.shard, total, args.num_shards))
    todo = answers.todo(total, args.shard, args.num_shards, done)
    if done:
        say(f"regenerate resume: {mine - len(todo)}/{mine} answers already done")
    tokens = ended = 0
    t0 = time.monotonic()
    try:
        if todo:
            items = [(i, su.prompts[i]) for i in todo]
            say("regenerate phase: model_init")
            if args.backend == "hf":
                stream = generate_hf(str(su.model_dir), items, args.sampling, su.stops, args.device)
            else:
                longest = max(len(p) for p in su.prompts) + args.sampling.max_new_tokens
                stream = generate_vllm(str(su.model_dir), items, args.sampling, su.stops, longest, args.batch_size)
            first = True
            n_done = mine - len(todo)
            for index, generated in stream:
                if first:
                    say("regenerate phase: generating")
                    t0, first = time.monotonic(), False  # the rate is the generation's, not the load's
                a = cut_answer(su.prompts[index], generated, su.stops)
                rec = a.record()
                journal.append(answers.Entry(index, rec["token_ids"], rec["loss_mask"], a.ended))
                n_done += 1
                tokens += len(a.answer_ids)
                ended += a.ended
                say(f"regenerate progress: {n_done}/{mine} answers, "
                    f"{tokens / max(time.monotonic() - t0, 1e-9):.1f} tok/s")
                _io.batch_delay()
    finally:
        journal.close()
    seconds = time.monotonic() - t0
    try:
        entries, missing = answers.collected(out, args.num_shards, su.fingerprint)
    except answers.JournalError as e:  # another shard's journal, of other settings
        raise RegenerateError(str(e)) from None
    if not missing and len(entries) >= total and all(i in entries for i in range(total)):
        answers.assemble(out, entries, total)
    elif args.num_shards > 1:
        say(f"regenerate shard {args.shard} of {args.num_shards} done; {out} is written once every shard is")
    say(f"regenerate: {mine} answers, {tokens} tokens generated, {tokens / max(seconds, 1e-9):.1f} tok/s, "
        f"{ended} ended by the model")
    return 0


def gather_main(argv: Sequence[str]) -> int:
    """``gather --out OUT --num-shards N``: assemble OUT from the shards' journals, or say what is missing."""
    ap = argparse.ArgumentParser(prog="python -m eagle3.regenerate gather")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-shards", type=int, required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        fp = _recorded_fingerprint(out, args.num_shards)
        entries, missing = answers.collected(out, args.num_shards, fp)
    except (OSError, answers.JournalError) as e:
        say(f"regenerate gather refused: {e}")
        return EXIT_CONFIG
    if missing:
        say(f"regenerate gather refused: shard(s) {', '.join(map(str, missing))} of {args.num_shards} have no "
            f"journal in {answers.parts_dir(out)}: run them, then gather")
        return EXIT_CONFIG
    total = max(entries, default=-1) + 1
    gaps = [i for i in range(total) if i not in entries]
    if gaps or not entries:
        say(f"regenerate gather refused: {len(gaps)} prompts have no answer yet: relaunch their shards")
        return EXIT_CONFIG
    answers.assemble(out, entries, total)
    say(f"regenerate gathered: {total} answers into {out}")
    return 0


def _recorded_fingerprint(out: Path, num_shards: int) -> dict[str, Any]:
    """The settings in the first shard journal there is (all must share them: collected() checks)."""
    for k in range(num_shards):
        path = answers.journal_path(out, k, num_shards)
        if path.exists():
            first = path.read_bytes().split(b"\n", 1)[0]
            return dict((json.loads(first) if first else {}).get("fingerprint") or {})
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gather"]:
        return gather_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m eagle3.regenerate",
                                 description="Have the target answer the prompts; write them for eagle3.extract.")
    ap.add_argument("--model", default="", help="the target's local model directory (empty: the embedded tiny "
                                                "model, built into --cache-dir as eagle3.extract builds it)")
    ap.add_argument("--cache-dir", default="", help="where the embedded tiny model is built")
    ap.add_argument("--prompts", required=True, help="JSONL prompt set (prompt, messages or token_ids records)")
    ap.add_argument("--out", required=True, help="JSONL of token_ids + loss_mask records to write")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, with a temperature")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed; prompt i is sampled with seed + i")
    ap.add_argument("--max-samples", type=int)
    ap.add_argument("--device", default="cpu", help="hf backend: cpu or cuda")
    ap.add_argument("--batch-size", type=int, default=256, help="vllm backend: prompts per generate call")
    ap.add_argument("--fsync-every", type=int, default=16, help="answers between fsyncs of the journal")
    ap.add_argument("--shard", type=int, default=0, help="this shard's index, 0..N-1 (prompt i: shard i mod N)")
    ap.add_argument("--num-shards", type=int, default=1)
    args = ap.parse_args(argv)
    args.sampling = Sampling(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    try:
        args.sampling.check()
        if not 0 <= args.shard < args.num_shards or args.batch_size < 1:
            raise RegenerateError(f"--shard {args.shard} --num-shards {args.num_shards} --batch-size "
                                  f"{args.batch_size}: 0 <= shard < num-shards, and a positive batch size")
        if args.fsync_every < 1:  # taken as 1 before: a value that means nothing is said, not guessed at
            raise RegenerateError(f"--fsync-every {args.fsync_every}: at least 1 (answers between fsyncs of the "
                                  "journal)")
        return regenerate(args)
    except RegenerateError as e:
        say(f"regenerate error: {e}")
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
