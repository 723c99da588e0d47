"""Training throughput of the EAGLE-3 draft job (jobs/eagle3/train.py) on this machine's CPU.

    .venv/bin/python tests/perf/bench_train.py [--steps N] [--threads 0] [--configs tiny,small]

For each configuration it writes a synthetic target (config.json + one safetensors file holding the
embeddings, final norm and lm_head: all the job reads of a target) and a synthetic extraction
(random bf16 hidden states, Zipf-like tokens), runs the job's own training loop in process and
prints the tokens/s of the job's progress lines, leaving out the first (warm-up) window.

* ``tiny``: the test fixture's size (hidden 64, vocab 192, 36-token samples, batch 4);
* ``small``: hidden 512, 8 heads / 2 KV heads, MLP 1376, vocab 8192 (draft 4096), 256-token
  samples, batch 4.

Both with 3 training-time-test steps, fp32 on the CPU. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "jobs"))

CONFIGS = {
    "tiny": {"hidden": 64, "heads": 4, "kv": 2, "inter": 128, "vocab": 192, "draft_vocab": 96, "seq": 36,
             "samples": 32, "batch": 4, "steps": 30},
    "small": {"hidden": 512, "heads": 8, "kv": 2, "inter": 1376, "vocab": 8192, "draft_vocab": 4096, "seq": 256,
              "samples": 32, "batch": 4, "steps": 9},
}


def make_data(base: Path, c: dict) -> Path:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    h, v = c["hidden"], c["vocab"]
    target = base / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": c["inter"], "num_hidden_layers": 8, "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv"], "vocab_size": v, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "tie_word_embeddings": False}))
    save_file({"model.embed_tokens.weight": torch.randn(v, h, generator=g).to(torch.bfloat16),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
               "lm_head.weight": (torch.randn(v, h, generator=g) * 0.5).to(torch.bfloat16)},
              str(target / "model.safetensors"))
    data = base / "extract"
    data.mkdir()
    zipf = 1.0 / (torch.arange(v, dtype=torch.float64) + 3.0)
    masked = torch.zeros(v, dtype=torch.int64)
    for i in range(c["samples"]):
        ids = torch.multinomial(zipf, c["seq"], replacement=True, generator=g)
        save_file({"hidden_states": torch.randn(c["seq"], 4, h, generator=g).to(torch.bfloat16),
                   "token_ids": ids, "loss_mask": torch.ones(c["seq"], dtype=torch.uint8)},
                  str(data / f"hs_{i}.safetensors"))
        masked += torch.bincount(ids, minlength=v)
    save_file({"token_freq": masked, "token_freq_all": masked.clone()}, str(data / "token_freq.safetensors"))
    (data / "manifest.json").write_text(json.dumps({
        "status": "complete", "model": str(target), "layer_ids": [2, 4, 5, 8], "num_hidden_layers": 8,
        "hidden_size": h, "vocab_size": v, "num_samples": c["samples"]}))
    return data


def bench(name: str, c: dict, steps: int, threads: int) -> float:
    from eagle3 import train as T

    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), c)
        window = max(steps // 3, 1)
        args = T.parse_args(["--data", str(data), "--out", str(Path(tmp) / "out"), "--device", "cpu",
                             "--batch-size", str(c["batch"]), "--draft-vocab", str(c["draft_vocab"]),
                             "--max-steps", str(steps), "--log-every", str(window), "--save-every", str(10 * steps),
                             "--threads", str(threads)])
        buf = io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stdout(buf):
            T.train(args)
        wall = time.monotonic() - t0
    rates = [float(m.group(1)) for m in re.finditer(r"^train step \d+/\d+ .*?tok/s=([\d.]+)", buf.getvalue(), re.MULTILINE)]
    steady = rates[2:] or rates[-1:]  # lines: step 1, then one per window; drop step 1 and the first window
    tps = sum(steady) / len(steady)
    tokens = c["batch"] * c["seq"]
    print(f"{name:>5}: hidden {c['hidden']}, vocab {c['vocab']} (draft {c['draft_vocab']}), {c['seq']} tokens x "
          f"batch {c['batch']}: {tps:,.0f} tok/s ({tokens / tps * 1000:.0f} ms/step), {steps} steps in {wall:.1f}s "
          f"wall incl. set-up", flush=True)
    return tps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="training steps per configuration (default: tiny 30, small 9)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--configs", default="tiny,small")
    args = ap.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads() if not args.threads else args.threads} thread(s), "
          f"3 TTT steps, fp32 CPU", flush=True)
    for name in args.configs.split(","):
        bench(name, CONFIGS[name], args.steps or CONFIGS[name]["steps"], args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
