"""The embedded default model: a tiny random-init Llama with a locally built tokenizer.

``python -m eagle3.tiny_model OUT_DIR`` writes, with no download:

* a byte-level BPE tokenizer trained (deterministically) on the shipped prompt set, with
  Llama-3 style special tokens and chat template, saved as a ``PreTrainedTokenizerFast``;
* a ``LlamaForCausalLM`` (8 layers, hidden 256 by default) initialised from a fixed seed, in
  bfloat16, saved with ``save_pretrained(max_shard_size=...)`` as several safetensors shards so
  that shard loading shows in the log.

The build happens in a temporary sibling directory that is renamed into place at the end, so
OUT_DIR either does not exist or holds a complete model. A complete model carries the marker file
``tiny_model.json`` with a fingerprint of its spec and prompt set; building the same again does
nothing (idempotent), while a build of another spec or prompt set is replaced. The same spec gives
the same bytes each time (fixed seed, deterministic tokenizer training).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "tiny_model.json"
BUILDER_VERSION = 1

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, START_HEADER, END_HEADER, EOT, PAD]

# Llama-3 style chat template. Every message is rendered as
# <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, after one BOS.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"


@dataclass(frozen=True)
class TinySpec:
    """What to build. The defaults are the embedded default model."""

    num_layers: int = 8
    hidden_size: int = 256
    intermediate_size: int = 688
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 1024  # BPE target size, special tokens included
    max_position_embeddings: int = 2048
    max_shard_size: str = "3MB"
    seed: int = 0
    dtype: str = "bfloat16"


def default_model_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """Where the job builds the embedded default model inside its cache directory."""
    return Path(cache_dir) / "tiny-llama"


def fingerprint(spec: TinySpec, corpus: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"builder": BUILDER_VERSION, "spec": asdict(spec)}, sort_keys=True).encode())
    h.update(Path(corpus).read_bytes())
    return h.hexdigest()


def corpus_texts(path: str | os.PathLike[str]) -> list[str]:
    """All texts of a JSONL prompt set, in file order (prompts and every message's content)."""
    texts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if "prompt" in rec:
                texts.append(rec["prompt"])
            for m in rec.get("messages", ()):
                texts.append(m["content"])
    return texts


def build_tokenizer(corpus: str | os.PathLike[str], vocab_size: int):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus``; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts(corpus), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def _marker(out_dir: Path) -> dict | None:
    try:
        info = json.loads((out_dir / MARKER).read_text())
        return info if isinstance(info, dict) and isinstance(info.get("files"), dict) else None
    except (OSError, ValueError):
        return None


def is_complete(out_dir: str | os.PathLike[str], spec: TinySpec | None = None,
                corpus: str | os.PathLike[str] | None = None) -> bool:
    """True when ``out_dir`` holds a finished build (marker present, every listed file there),
    and, when ``spec`` and ``corpus`` are given, a build of exactly that spec and corpus."""
    out = Path(out_dir)
    info = _marker(out)
    if info is None:
        return False
    if spec is not None and corpus is not None and info.get("fingerprint") != fingerprint(spec, corpus):
        return False
    return all((out / name).is_file() and (out / name).stat().st_size == size
               for name, size in info["files"].items())


def _fsync_tree(d: Path) -> None:
    for p in [*d.iterdir(), d]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_model(tmp: Path, spec: TinySpec, corpus: str | os.PathLike[str]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(corpus, spec.vocab_size)
    tokenizer.save_pretrained(tmp)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    cfg.dtype = spec.dtype
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(cfg).to(getattr(torch, spec.dtype))
    model.save_pretrained(tmp, max_shard_size=spec.max_shard_size)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    info = {"builder": BUILDER_VERSION, "spec": asdict(spec), "fingerprint": fingerprint(spec, corpus),
            "files": files}
    (tmp / MARKER).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    _fsync_tree(tmp)


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def build(out_dir: str | os.PathLike[str], spec: TinySpec = TinySpec(),
          corpus: str | os.PathLike[str] = DEFAULT_PROMPTS, quiet: bool = False) -> Path:
    """Build the tiny model into ``out_dir`` unless the same build is already complete there.

    A complete build of another spec or corpus (the marker says so) is replaced; any other
    non-empty directory is left alone and refused.
    """
    out = Path(out_dir)
    if is_complete(out, spec, corpus):
        if not quiet:
            print(f"tiny model: already complete in {out}", flush=True)
        return out
    replacing = _marker(out) is not None
    if out.exists() and any(out.iterdir()) and not replacing:
        raise FileExistsError(
            f"{out} exists, is not empty and holds no tiny model ({MARKER} missing): "
            "remove it or choose another directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed build
        if not _pid_alive(stale.name.rsplit(".tmp-", 1)[1].split("-")[0]):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.tmp-{os.getpid()}-old"
    tmp.mkdir()
    try:
        _write_model(tmp, spec, corpus)
        if replacing:
            if not quiet:
                print(f"tiny model: replacing the build in {out} (its spec or prompt set changed)", flush=True)
            os.replace(out, old)
        try:
            os.replace(tmp, out)  # also replaces an empty directory
        except OSError:
            if not is_complete(out, spec, corpus):  # someone else finished first: keep theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        shards = sorted(p.name for p in out.glob("*.safetensors"))
        print(f"tiny model: built in {out} ({len(shards)} shards)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.tiny_model", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--corpus", default=str(DEFAULT_PROMPTS), help="JSONL prompt set the tokenizer is trained on")
    ap.add_argument("--layers", type=int, default=TinySpec.num_layers)
    ap.add_argument("--hidden", type=int, default=TinySpec.hidden_size)
    args = ap.parse_args(argv)
    spec = TinySpec(num_layers=args.layers, hidden_size=args.hidden)
    if args.hidden != TinySpec.hidden_size:
        spec = TinySpec(num_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
                        num_heads=max(1, args.hidden // 64), num_kv_heads=max(1, args.hidden // 128))
    build(args.out_dir, spec, args.corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
