"""A small *trained* target for the EAGLE-3 end-to-end run, built with no download.

    PYTHONPATH=jobs python tests/perf/gpu/e2e_target.py build OUT_DIR [--steps 1500] [--size base|tiny|small|mla]
        [--text synthetic|docstrings]
    PYTHONPATH=jobs python tests/perf/gpu/e2e_target.py prompts OUT_DIR --extract N --bench M

``build`` writes a synthetic corpus with learnable structure (templated dialogues over a fixed table
of facts, two-digit arithmetic, code-like snippets, counting), trains a byte-level BPE tokenizer on it
(``eagle3.tiny_model.build_tokenizer``) and a Llama from scratch (``base``: hidden 768, 12 layers,
~86M parameters) for a fixed number of steps, and saves it as safetensors shards with the tokenizer.
Everything is seeded, so the same command gives the same data, tokenizer and initial weights; the GPU's
kernels decide the last bits of the trained weights.

``--text docstrings`` trains on natural English instead: the docstrings of the installed Python
(``docstring_corpus.py``) as conversations with a thinking section, a 32,000-token byte-level BPE with a
thinking chat template (``thinking_template()``), and reports a held-out loss on files never trained on;
``prompts`` then writes the held-out files' conversations for the drafts (``docstring_prompts``).

``prompts`` writes, from another seed and with every document that also occurs in the training
corpus dropped (held apart), ``extract.jsonl`` (whole documents for ``eagle3.extract``),
``extract_quarter.jsonl`` (its first quarter) and ``bench.jsonl`` (document openings that stop
right after an ``Assistant:`` or a ``print(``, for ``vllm serve``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ANIMALS = ["otter", "heron", "badger", "lynx", "gecko", "walrus", "falcon", "marmot", "ibis", "tapir",
           "okapi", "bison", "newt", "puffin", "jackal", "koala", "lemur", "mole", "quail", "raven",
           "shrew", "stoat", "toad", "vole"]
COLORS = ["red", "blue", "green", "grey", "golden", "black", "white", "brown", "silver", "spotted"]
PLACES = ["river", "forest", "desert", "marsh", "canyon", "meadow", "glacier", "reef", "cave", "hill",
          "valley", "island"]
FOODS = ["berries", "fish", "seeds", "beetles", "roots", "grass", "snails", "worms", "fruit", "moss",
         "eggs", "leaves"]
ADJS = ["shy", "curious", "quick", "patient", "noisy", "gentle", "clever", "sleepy"]
NAMES = ["scale", "shift", "mix", "fold", "clip", "wrap"]
SEED_TRAIN, SEED_HELD = 25, 2500
SIZES = {"base": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                      num_key_value_heads=12),
         "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                      num_key_value_heads=4),
         # Seconds to train on one GPU (800 steps in 19 s on an H100), with vLLM's usual head size (64) for the
         # target and its draft; on two shared CPU cores a step of 16 x 256 tokens took over 2 s.
         "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=2,
                       num_key_value_heads=2),
         # A DeepSeek-V2 (MLA attention, routed experts) with a 32,000-row vocabulary: the family of the
         # mission's target, small enough to train here.
         "mla": dict(hidden_size=512, intermediate_size=1408, moe_intermediate_size=256, num_hidden_layers=6,
                     num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1,
                     num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=256, q_lora_rank=None,
                     qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, topk_method="greedy", n_group=1,
                     topk_group=1)}
MLA_VOCAB = 32000
# eagle3.tiny_model's Llama-3 style template with a thinking section, as Qwen3's: the assistant's answer
# opens with <think>…</think>; a generation prompt with enable_thinking=False closes an empty one, so the
# model answers at once.
_NO_THINKING = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"


def thinking_template() -> str:
    """The thinking chat template: eagle3.tiny_model's chat template, its generation prompt followed by ``_NO_THINKING``."""
    from eagle3.tiny_model import CHAT_TEMPLATE

    prompt = "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    assert CHAT_TEMPLATE.count(prompt) == 1, "eagle3.tiny_model's generation prompt changed"
    return CHAT_TEMPLATE.replace(prompt, prompt + _NO_THINKING)


def fact(animal: str, table: list[str], salt: int) -> str:
    """A fixed 'fact' per animal (what it eats, where it lives): learnable, not guessable from the name."""
    h = int(hashlib.sha256(f"{animal}/{salt}".encode()).hexdigest(), 16)
    return table[h % len(table)]


def segment(rng: random.Random) -> str:
    kind = rng.randrange(5)
    a = rng.choice(ANIMALS)
    if kind == 0:
        return (f"User: What does the {a} eat? Assistant: The {a} eats {fact(a, FOODS, 1)} "
                f"and lives in the {fact(a, PLACES, 2)}.")
    if kind == 1:
        x, y = rng.randrange(100), rng.randrange(100)
        return f"User: What is {x} plus {y}? Assistant: {x} plus {y} is {x + y}."
    if kind == 2:
        n, k, v = rng.choice(NAMES), rng.randrange(2, 10), rng.randrange(1, 20)
        return f"def {n}_{k}(x):\n    return x * {k}\n\nprint({n}_{k}({v}))  # {k * v}"
    if kind == 3:
        s, n = rng.randrange(90), rng.randrange(4, 10)
        return f"Count from {s} to {s + n}: " + ", ".join(str(i) for i in range(s, s + n + 1)) + "."
    c = rng.choice(COLORS)
    return (f"User: Describe the {c} {a}. Assistant: The {c} {a} is {fact(a, ADJS, 3)} and sleeps in the "
            f"{fact(a, PLACES, 2)}. Every morning the {c} {a} eats {fact(a, FOODS, 1)}.")


def document(rng: random.Random) -> str:
    return "\n\n".join(segment(rng) for _ in range(rng.randrange(4, 9)))


def corpus(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(n)]


def doc_key(doc: str) -> str:
    return hashlib.sha1(doc.encode()).hexdigest()


def synthetic_text(out: Path, docs: int) -> tuple[Any, list[int], list[int]]:
    """(tokenizer, training token stream, held-out token stream) of the synthetic corpus."""
    from eagle3.tiny_model import build_tokenizer

    texts = corpus(SEED_TRAIN, docs)
    (out / "train_docs.sha1").write_text("\n".join(sorted({doc_key(d) for d in texts})) + "\n")
    tok_src = out / "tokenizer_corpus.jsonl"
    with tok_src.open("w") as f:
        for d in texts[:4000]:
            f.write(json.dumps({"prompt": d}) + "\n")
    tok = build_tokenizer(tok_src, vocab_size=2048)
    tok_src.unlink()
    ids = [t for enc in tok(texts, add_special_tokens=True)["input_ids"] for t in [*enc, tok.eos_token_id]]
    return tok, ids, []


def docstring_text(out: Path, docs: int) -> tuple[Any, list[int], list[int]]:
    """(tokenizer, training stream, held-out stream) of the docstring conversations (docstring_corpus.py).

    The tokenizer is a byte-level BPE of ``MLA_VOCAB`` tokens trained on the training conversations'
    text, with the thinking chat template; the held-out files' conversations are written to
    ``held_docs.jsonl`` for ``prompts``."""
    from dataclasses import asdict

    from docstring_corpus import collect

    found, notes = collect(docs or None)
    for n in notes:
        print(f"text source {n}", flush=True)
    train, held = [d for d in found if not d.held], [d for d in found if d.held]
    with (out / "held_docs.jsonl").open("w") as f:
        f.writelines(json.dumps(asdict(d)) + "\n" for d in held)
    tok = thinking_tokenizer((t for d in train for t in (d.messages()[0]["content"], d.answer())), MLA_VOCAB)

    def stream(ds: list[Any]) -> list[int]:
        texts = [tok.apply_chat_template(d.messages(), tokenize=False) for d in ds]
        return [t for enc in tok(texts, add_special_tokens=False)["input_ids"] for t in enc]

    print(f"docstrings: {len(train)} conversations for training, {len(held)} held out (other files), "
          f"{sum(len(d.text) for d in found) / 1e6:.1f}M characters", flush=True)
    return tok, stream(train), stream(held)


def thinking_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (the special tokens of eagle3.tiny_model plus
    ``<think>``/``</think>``) with ``thinking_template()``; deterministic for the same texts."""
    from eagle3.tiny_model import BOS, EOT, PAD, SPECIAL_TOKENS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=[*SPECIAL_TOKENS, "<think>", "</think>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOT, pad_token=PAD,
                                   chat_template=thinking_template(), model_max_length=2048,
                                   clean_up_tokenization_spaces=False)


def held_loss(model: Any, rows: Any, dev: str) -> float:
    """Mean loss on held-out rows (no gradient), in eval mode; the model is put back in train mode."""
    import torch

    model.eval()
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
        losses = [model(input_ids=rows[i:i + 16].to(dev), labels=rows[i:i + 16].to(dev)).loss.item()
                  for i in range(0, rows.shape[0], 16)]
    model.train()
    return sum(losses) / max(len(losses), 1)


def build(out: Path, steps: int, size: str, docs: int, seq: int, batch: int, lr: float, text: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    tok, ids, held_ids = (docstring_text if text == "docstrings" else synthetic_text)(out, docs)
    stream = torch.tensor(ids, dtype=torch.int64)
    rows = stream[: (len(stream) // seq) * seq].view(-1, seq)
    held = torch.tensor(held_ids[: (min(len(held_ids), 64 * seq) // seq) * seq], dtype=torch.int64).view(-1, seq)
    print(f"target corpus: {len(ids)} tokens, {rows.shape[0]} rows of {seq}; held-out {len(held_ids)} tokens; "
          f"vocab {len(tok)}; {time.monotonic() - t0:.1f}s", flush=True)

    torch.manual_seed(SEED_TRAIN)
    special = dict(tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id, max_position_embeddings=2048)
    if size == "mla":
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
        # The model's vocabulary has 32,000 rows (the tokenizer uses the first ones): the output layer and the
        # draft's vocabulary mapping work at a real model's width.
        cfg = DeepseekV2Config(vocab_size=MLA_VOCAB, rope_theta=10000.0, **special, **SIZES[size])
        model_cls = DeepseekV2ForCausalLM
    else:
        cfg = LlamaConfig(vocab_size=len(tok), rope_theta=10000.0, **special, **SIZES[size])
        model_cls = LlamaForCausalLM
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model_cls(cfg).to(dev)
    print(f"target model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters on {dev}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda")
    warm = max(steps // 20, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0)))))
    gen = torch.Generator().manual_seed(SEED_TRAIN)
    order = torch.randperm(rows.shape[0], generator=gen)
    model.train()
    t1, pos = time.monotonic(), 0
    for step in range(1, steps + 1):
        if pos + batch > len(order):
            order, pos = torch.randperm(rows.shape[0], generator=gen), 0
        x = rows[order[pos:pos + batch]].to(dev)
        pos += batch
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps:
            el = time.monotonic() - t1
            ev = f" held_out_loss={held_loss(model, held, dev):.4f}" if held.numel() and (
                step % 250 == 0 or step == steps) else ""
            print(f"target step {step}/{steps} loss={loss.item():.4f} tok/s={step * batch * seq / el:.0f}{ev}",
                  flush=True)
    final_held = held_loss(model, held, dev) if held.numel() else None
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True, max_shard_size="60MB")
    tok.save_pretrained(out)
    (out / "e2e_target.json").write_text(json.dumps(
        {"size": size, "steps": steps, "docs": docs, "seq": seq, "batch": batch, "lr": lr, "final_loss": loss.item(),
         "train_s": round(time.monotonic() - t1, 1), "vocab": len(tok), "text": text,
         "tokens": len(ids), "held_out_loss": final_held}, indent=1) + "\n")
    print(f"target saved to {out} after {time.monotonic() - t0:.0f}s", flush=True)


def opening(doc: str) -> str:
    """The document up to the first answer or printed result the model must produce."""
    cut = [i + len(m) for m in ("Assistant:", "print(") if (i := doc.find(m)) >= 0]
    return doc[: min(cut)] if cut else doc[: len(doc) // 2]


def prompts(model_dir: Path, n_extract: int, n_bench: int) -> None:
    if (model_dir / "held_docs.jsonl").exists():
        return docstring_prompts(model_dir, n_extract, n_bench)
    seen = set((model_dir / "train_docs.sha1").read_text().split())
    held = [d for d in corpus(SEED_HELD, 4 * (n_extract + n_bench)) if doc_key(d) not in seen]
    ext, bench = held[:n_extract], held[n_extract:n_extract + n_bench]
    if len(bench) < n_bench:
        raise SystemExit("not enough held-apart documents")
    for name, docs in (("extract.jsonl", ext), ("extract_quarter.jsonl", ext[: len(ext) // 4])):
        with (model_dir / name).open("w") as f:
            f.writelines(json.dumps({"prompt": d}) + "\n" for d in docs)
    with (model_dir / "bench.jsonl").open("w") as f:
        f.writelines(json.dumps({"prompt": opening(d)}) + "\n" for d in bench)
    print(f"prompts: {len(ext)} extract ({len(ext) // 4} in the quarter), {len(bench)} bench, "
          f"{4 * (n_extract + n_bench) - len(held)} dropped as seen in training", flush=True)


N_HELDOUT = 200
COVERAGE_KS = (4096, 8192, 16384, 24576, 32000)


def docstring_prompts(model_dir: Path, n_extract: int, n_bench: int) -> None:
    """The held-out files' conversations, shuffled (seeded): the last ``N_HELDOUT`` are the drafts' held-out
    set (``heldout_docs.jsonl``, ``heldout_asks.jsonl``), up to ``n_extract`` before them the drafts' training
    set (``draft_docs.jsonl``: the conversation with the docstring's answer; ``draft_asks.jsonl``: the user turn
    alone, for eagle3.regenerate). ``bench.jsonl``: the first ``n_bench`` held-out user turns as token ids
    with the generation prompt (thinking on). ``coverage.json``: the share of the held-out answers' tokens
    inside the k most frequent tokens of the draft training answers, for each k of ``COVERAGE_KS``."""
    from collections import Counter

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    docs = [json.loads(line) for line in (model_dir / "held_docs.jsonl").read_text().splitlines()]
    random.Random(SEED_HELD).shuffle(docs)
    held, train = docs[-N_HELDOUT:], docs[:-N_HELDOUT][:n_extract]
    from docstring_corpus import Doc

    sets = {"draft": [Doc(**d) for d in train], "heldout": [Doc(**d) for d in held]}
    for name, ds in sets.items():
        with (model_dir / f"{name}_docs.jsonl").open("w") as f:
            f.writelines(json.dumps({"messages": d.messages()}) + "\n" for d in ds)
        with (model_dir / f"{name}_asks.jsonl").open("w") as f:
            f.writelines(json.dumps({"messages": d.messages(with_answer=False)}) + "\n" for d in ds)
    with (model_dir / "bench.jsonl").open("w") as f:
        for d in sets["heldout"][:n_bench]:
            text = tok.apply_chat_template(d.messages(with_answer=False), tokenize=False, add_generation_prompt=True,
                                           enable_thinking=True)
            f.write(json.dumps({"prompt": tok(text, add_special_tokens=False)["input_ids"]}) + "\n")

    def answer_ids(ds: list[Any]) -> list[int]:
        # The answer and its end-of-turn token: what the assistant-only loss mask covers.
        return [t for enc in tok([d.answer() for d in ds], add_special_tokens=False)["input_ids"]
                for t in [*enc, tok.eos_token_id]]

    freq = Counter(answer_ids(sets["draft"]))
    held_ids = answer_ids(sets["heldout"])
    ranked = [t for t, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))]
    cov = {}
    for k in COVERAGE_KS:
        top = set(ranked[:k])
        cov[k] = sum(t in top for t in held_ids) / len(held_ids)
    distinct = len(set(held_ids))
    info = {"draft_docs": len(train), "heldout_docs": len(held), "bench": n_bench,
            "draft_answer_tokens": sum(freq.values()), "draft_distinct_tokens": len(freq),
            "heldout_answer_tokens": len(held_ids), "heldout_distinct_tokens": distinct,
            "vocab": len(tok), "coverage_of_heldout": cov}
    (model_dir / "coverage.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"prompts: {len(train)} draft conversations ({info['draft_answer_tokens']} answer tokens, "
          f"{len(freq)} distinct ids), {len(held)} held out ({len(held_ids)} tokens, {distinct} distinct), "
          f"{n_bench} bench", flush=True)
    print("coverage of held-out answer tokens by the k most frequent draft-training tokens: "
          + ", ".join(f"{k}: {c:.1%}" for k, c in cov.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("--steps", type=int, default=1500)
    b.add_argument("--size", choices=sorted(SIZES), default="base")
    b.add_argument("--docs", type=int, default=40000)
    b.add_argument("--seq", type=int, default=512)
    b.add_argument("--batch", type=int, default=32)
    b.add_argument("--lr", type=float, default=6e-4)
    b.add_argument("--text", choices=("synthetic", "docstrings"), default="synthetic",
                   help="synthetic: the templated corpus; docstrings: the installed Python's docstrings as "
                        "conversations with a thinking section, a 32,000-token BPE (docstring_corpus.py)")
    p = sub.add_parser("prompts")
    p.add_argument("out", type=Path)
    p.add_argument("--extract", type=int, default=4000)
    p.add_argument("--bench", type=int, default=64)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.steps, a.size, a.docs, a.seq, a.batch, a.lr, a.text)
    else:
        prompts(a.out, a.extract, a.bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
