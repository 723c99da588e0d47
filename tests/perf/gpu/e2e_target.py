"""A small *trained* target for the EAGLE-3 end-to-end run, built with no download.

    PYTHONPATH=jobs python tests/perf/gpu/e2e_target.py build OUT_DIR [--steps 1500] [--size base|tiny]
    PYTHONPATH=jobs python tests/perf/gpu/e2e_target.py prompts OUT_DIR --extract N --bench M

``build`` writes a synthetic corpus with learnable structure (templated dialogues over a fixed table
of facts, two-digit arithmetic, code-like snippets, counting), trains a byte-level BPE tokenizer on it
(``eagle3.tiny_model.build_tokenizer``) and a Llama from scratch (``base``: hidden 768, 12 layers,
~86M parameters) for a fixed number of steps, and saves it as safetensors shards with the tokenizer.
Everything is seeded, so the same command gives the same data, tokenizer and initial weights; the GPU's
kernels decide the last bits of the trained weights.

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
from pathlib import Path

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
         # A DeepSeek-V2 (MLA attention, routed experts) with a 32,000-row vocabulary: the family of the
         # mission's target, small enough to train here.
         "mla": dict(hidden_size=512, intermediate_size=1408, moe_intermediate_size=256, num_hidden_layers=6,
                     num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1,
                     num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=256, q_lora_rank=None,
                     qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, topk_method="greedy", n_group=1,
                     topk_group=1)}
MLA_VOCAB = 32000


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


def build(out: Path, steps: int, size: str, docs: int, seq: int, batch: int, lr: float) -> None:
    import torch
    from eagle3.tiny_model import build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    texts = corpus(SEED_TRAIN, docs)
    (out / "train_docs.sha1").write_text("\n".join(sorted({doc_key(d) for d in texts})) + "\n")
    tok_src = out / "tokenizer_corpus.jsonl"
    with tok_src.open("w") as f:
        for d in texts[:4000]:
            f.write(json.dumps({"prompt": d}) + "\n")
    tok = build_tokenizer(tok_src, vocab_size=2048)
    tok_src.unlink()
    ids = [t for enc in tok(texts, add_special_tokens=True)["input_ids"] for t in enc + [tok.eos_token_id]]
    stream = torch.tensor(ids, dtype=torch.int64)
    rows = stream[: (len(stream) // seq) * seq].view(-1, seq)
    print(f"target corpus: {len(texts)} documents, {len(ids)} tokens, {rows.shape[0]} rows of {seq}; "
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
            print(f"target step {step}/{steps} loss={loss.item():.4f} tok/s={step * batch * seq / el:.0f}", flush=True)
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True, max_shard_size="60MB")
    tok.save_pretrained(out)
    (out / "e2e_target.json").write_text(json.dumps(
        {"size": size, "steps": steps, "docs": docs, "seq": seq, "batch": batch, "lr": lr, "final_loss": loss.item(),
         "train_s": round(time.monotonic() - t1, 1), "vocab": len(tok)}, indent=1) + "\n")
    print(f"target saved to {out} after {time.monotonic() - t0:.0f}s", flush=True)


def opening(doc: str) -> str:
    """The document up to the first answer or printed result the model must produce."""
    cut = [i + len(m) for m in ("Assistant:", "print(") if (i := doc.find(m)) >= 0]
    return doc[: min(cut)] if cut else doc[: len(doc) // 2]


def prompts(model_dir: Path, n_extract: int, n_bench: int) -> None:
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
    p = sub.add_parser("prompts")
    p.add_argument("out", type=Path)
    p.add_argument("--extract", type=int, default=4000)
    p.add_argument("--bench", type=int, default=64)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.steps, a.size, a.docs, a.seq, a.batch, a.lr)
    else:
        prompts(a.out, a.extract, a.bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
