"""Shared helpers of the tests of the EAGLE-3 training job (jobs/eagle3/train.py).

The fixture is a tiny random Llama saved by transformers (two safetensors shards and an index) and
an extraction output written exactly to the extract job's contract: ``manifest.json``,
``hs_{i}.safetensors`` (``hidden_states`` bf16 ``[T, 4, H]`` for layer ids 1, 2, 3, L=4 in vLLM
numbering, ``token_ids`` int64, ``loss_mask`` uint8) and ``token_freq.safetensors``. The hidden
states are the model's own: id k < L is the input of decoder layer k, id L the last layer's output
before the final norm. The target's ``lm_head`` is scaled up so that its next-token distributions are
peaked (a random Llama's are nearly flat), which gives the draft a clear argmax to learn.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"
if str(JOBS) not in sys.path:
    sys.path.insert(0, str(JOBS))

VOCAB = 192
HIDDEN = 64
LAYERS = 4
LAYER_IDS = [1, 2, 3, 4]
N_SAMPLES = 24
MARKER = "fixture.json"

THIRD_PARTY_WARNINGS = [
    "ignore::DeprecationWarning:transformers.*",
    "ignore::DeprecationWarning:torch.*",
    "ignore::FutureWarning:transformers.*",
    "ignore::UserWarning:torch.*",
    "ignore::UserWarning:transformers.*",
]


def _tokens(rng, n: int, vocab: int):
    """Zipf-like token ids (so the draft vocabulary's choice matters), avoiding id 0."""
    import torch

    weights = 1.0 / (torch.arange(vocab, dtype=torch.float64) + 3.0)
    weights[0] = 0.0
    perm = torch.randperm(vocab, generator=rng)
    weights = weights[perm.argsort()]  # frequent ids scattered over the vocabulary
    return torch.multinomial(weights, n, replacement=True, generator=rng)


def make_fixture(base: Path) -> Path:
    """Build (once) the target model and extraction under ``base``; returns the data directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    data = base / "extract"
    if (base / MARKER).is_file():
        return data
    model_dir = base / "target"
    data.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
        model.model.embed_tokens.weight.mul_(10.0)
    model.eval()
    model.save_pretrained(model_dir, max_shard_size="100KB")

    rng = torch.Generator().manual_seed(99)
    captured: dict[str, torch.Tensor] = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda mod, args, out: captured.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    seq_lens, masked, every = [], torch.zeros(VOCAB, dtype=torch.int64), torch.zeros(VOCAB, dtype=torch.int64)
    for i in range(N_SAMPLES):
        t = int(torch.randint(24, 48, (1,), generator=rng))
        ids = torch.cat([torch.tensor([1]), _tokens(rng, t - 1, VOCAB)])
        mask = torch.ones(t, dtype=torch.uint8)
        if i % 2:  # chat-like: a prompt part outside the loss
            mask[: t // 3] = 0
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        layers = [out.hidden_states[k][0] if k < LAYERS else captured["last"][0] for k in LAYER_IDS]
        hs = torch.stack(layers, dim=1).to(torch.bfloat16)
        save_file({"hidden_states": hs.contiguous(), "token_ids": ids, "loss_mask": mask},
                  str(data / f"hs_{i}.safetensors"))
        seq_lens.append(t)
        every += torch.bincount(ids, minlength=VOCAB)
        masked += torch.bincount(ids[mask.bool()], minlength=VOCAB)
    hook.remove()
    save_file({"token_freq": masked, "token_freq_all": every}, str(data / "token_freq.safetensors"))
    manifest = {
        "format": "eagle3-hidden-states/1", "status": "complete", "model": str(model_dir.resolve()),
        "model_type": "llama", "backend": "hf", "layer_ids": LAYER_IDS, "num_hidden_layers": LAYERS,
        "n_layers_stored": len(LAYER_IDS), "hidden_size": HIDDEN, "vocab_size": VOCAB, "dtype": "bfloat16",
        "num_samples": N_SAMPLES, "finished": N_SAMPLES, "seq_lens": seq_lens, "total_tokens": sum(seq_lens),
        "files": {"sample": "hs_{i}.safetensors", "token_freq": "token_freq.safetensors"},
        "fingerprint": {"data_sha256": "fixture", "layer_ids": LAYER_IDS},
    }
    (data / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (base / MARKER).write_text("{}\n")
    return data


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    """CLI arguments of a small, quick run on the fixture."""
    return ["--data", str(data), "--out", str(out), "--device", "cpu", "--batch-size", "4",
            "--draft-vocab", "96", "--lr", "3e-3", "--log-every", "1", "--threads", "1", *extra]


@contextlib.contextmanager
def torch_threads_kept():
    """Restore torch's thread count after in-process runs (``--threads 1`` sets it process-wide)."""
    import torch

    n = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(n)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    env.update({"PYTHONPATH": str(JOBS), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def popen_train(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eagle3.train", *args], cwd=REPO, env=cli_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_train(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3.train", *args], cwd=REPO, env=cli_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)


def final_state(out: Path) -> dict:
    """The model weights (fp32) of the newest checkpoint in ``out``."""
    import torch

    newest = max((out / "checkpoints").glob("step_*"))
    return torch.load(newest / "state.pt", map_location="cpu", weights_only=True)
