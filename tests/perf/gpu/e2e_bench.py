"""Measure a running ``vllm serve`` (OpenAI completions API) at batch 1 and 8, greedy and at temperature 0.7.

    python tests/perf/gpu/e2e_bench.py --port 8011 --prompts bench.jsonl --label draft --out DIR

Standard library only (runs under the GPU machine's python). For each setting it sends the bench
prompts (batch 1: one request at a time; batch 8: eight in flight), ``max_tokens`` each with
``ignore_eos`` so every request generates the same length, and reads vLLM's own speculative-decoding
counters from ``/metrics`` before and after (``vllm:spec_decode_num_drafts``, ``…num_draft_tokens``,
``…num_accepted_tokens``, ``…num_accepted_tokens_per_pos``). Writes ``DIR/LABEL.json``: per setting the
generated tokens per second (wall clock of the whole setting), the acceptance rate (accepted / drafted
tokens), the mean acceptance length (1 + accepted / drafts, the tokens one target step yields) and the
per-position acceptance; and the greedy batch-1 completions, so that two servers can be compared
token for token.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SPEC = re.compile(r'^vllm:(spec_decode_num_\w+?)(?:_total)?(?:\{([^}]*)\})?\s+([0-9.eE+-]+)$')


def counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SPEC.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        pos = re.search(r'position="(\d+)"', labels or "")
        key = f"{name}[{pos.group(1)}]" if pos else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def complete(port: int, model: str, prompt: str, max_tokens: int, temperature: float, seed: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": True, "seed": seed, "return_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=300))
    choice = r["choices"][0]
    return {"text": choice["text"], "token_ids": choice.get("token_ids"),
            "tokens": r["usage"]["completion_tokens"]}


def setting(port: int, model: str, prompts: list[str], batch: int, temperature: float, max_tokens: int) -> dict:
    before = counters(port)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=batch) as pool:
        outs = list(pool.map(lambda ip: complete(port, model, ip[1], max_tokens, temperature, ip[0]),
                             enumerate(prompts)))
    wall = time.monotonic() - t0
    after = counters(port)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts, drafted, accepted = (d.get(f"spec_decode_num_{k}", 0.0) for k in ("drafts", "draft_tokens",
                                                                               "accepted_tokens"))
    per_pos = [d[k] / drafts for k in sorted((k for k in d if k.startswith("spec_decode_num_accepted_tokens_per_pos[")),
                                            key=lambda k: int(k.rsplit("[", 1)[1][:-1]))] if drafts else []
    tokens = sum(o["tokens"] for o in outs)
    return {"batch": batch, "temperature": temperature, "requests": len(prompts), "tokens": tokens,
            "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1), "drafts": drafts,
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
            "acceptance_per_pos": [round(x, 4) for x in per_pos], "outputs": outs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n1", type=int, default=16, help="prompts at batch 1")
    ap.add_argument("--n8", type=int, default=64, help="prompts at batch 8")
    a = ap.parse_args()
    models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{a.port}/v1/models", timeout=30))
    model = models["data"][0]["id"]
    prompts = [json.loads(line)["prompt"] for line in a.prompts.read_text().splitlines() if line.strip()]
    # A warm-up request, so that the first timed one does not pay for lazy initialisation.
    complete(a.port, model, prompts[0], 16, 0.0, 0)
    results = []
    for batch, n in ((1, a.n1), (8, a.n8)):
        for temp in (0.0, 0.7):
            r = setting(a.port, model, prompts[:n], batch, temp, a.max_tokens)
            print(f"{a.label}: batch {batch} temp {temp}: {r['tok_s']} tok/s, acceptance "
                  f"{r['acceptance_rate']}, mean acceptance length {r['mean_acceptance_length']}", flush=True)
            results.append(r)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.label}.json").write_text(json.dumps({"label": a.label, "model": model, "settings": results},
                                                      indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
