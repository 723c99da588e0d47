"""Tokens/s of the extract job's hf backend beside a plain transformers forward over the same data.

    PYTHONPATH=jobs python tests/perf/bench_extract.py [--device cpu|cuda] [--hidden 256] [--layers 8]
                                                      [--samples 64] [--batch-size 4] [--repeat 1]

Runs under the jobs' interpreter (torch, transformers), never imports the supervisor.
1. Builds a random-init Llama of the given size with `eagle3.tiny_model` (cached under /tmp).
2. Runs the real job (`python -m eagle3.extract`) as a subprocess and times its extraction phase from
   the arrival of its own lines: `extract phase: extracting` -> `extract done` (reading the batches,
   running the model, writing every `hs_{i}.safetensors` atomically).
3. Runs plain transformers over the same token ids (read back from the job's output), in the same
   batches with the same padding: `model(ids, output_hidden_states=True)` (what people write) and the
   base model alone (no lm_head), after one warm-up batch.
Prints a markdown table: tokens/s of each and the job's overhead against the plain forward.

    PYTHONPATH=jobs python tests/perf/bench_extract.py --io [--baseline REV] [--hidden 2048] [--layers 8]
                                                      [--samples 64] [--seq-len 512]

``--io`` measures bytes written per byte of hidden state instead, on CPU: the vLLM backend runs in this
process against the fake of vLLM's engine and staged-file writer (tests/fakes/fake_vllm.py, the one
tests/test_extract_vllm.py uses; its writes count as vLLM's would), on a config-only target of the
given size and random token-id prompts; then ``eagle3.export`` to ours and to speculators' layout.
Bytes written are the ``wchar`` of /proc/self/io (every write(2), sendfile and copy_file_range of the
process and its threads; the job's lines go to memory). Each figure is measured for this checkout's
jobs/ and for ``--baseline``'s (default db0bcc7, the last commit before the staged files were renamed
into place and exports hard-linked), in subprocesses, and printed side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs"
DONE_RE = re.compile(r"extract done: (\d+) samples, (\d+) tokens")


def build_model(hidden: int, layers: int) -> Path:
    out = Path(tempfile.gettempdir()) / f"bench-llama-h{hidden}-l{layers}"
    env = {**os.environ, "PYTHONPATH": str(JOBS)}
    subprocess.run([sys.executable, "-m", "eagle3.tiny_model", str(out), "--hidden", str(hidden),
                    "--layers", str(layers)], check=True, env=env, capture_output=True)
    return out


def prompt_set(repeat: int, where: Path) -> Path:
    """The shipped prompt set, `repeat` times over: enough tokens that start-up costs amortise."""
    lines = (JOBS / "data" / "prompts.jsonl").read_text().splitlines()
    path = where / "prompts.jsonl"
    path.write_text("\n".join(lines * repeat) + "\n")
    return path


def run_job(model: Path, out: Path, prompts: Path, device: str, samples: int, batch_size: int) -> tuple[float, int]:
    """Seconds of the job's extraction phase and the tokens it extracted."""
    env = {**os.environ, "PYTHONPATH": str(JOBS), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "eagle3.extract", "--model", str(model), "--out", str(out), "--device", device,
           "--batch-size", str(batch_size), "--max-samples", str(samples), "--prompts", str(prompts)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    started = tokens = None
    ended = None
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter()
        if line.startswith("extract phase: extracting"):
            started = now
        if m := DONE_RE.search(line):
            ended, tokens = now, int(m.group(2))
    if proc.wait() != 0 or started is None or ended is None or tokens is None:
        raise SystemExit(f"the job failed (exit {proc.returncode})")
    return ended - started, tokens


def plain_forward(model_dir: Path, out: Path, device: str, samples: int, batch_size: int) -> dict[str, float]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    token_lists = [load_file(str(out / f"hs_{i}.safetensors"))["token_ids"].tolist() for i in range(samples)]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto").to(device).eval()
    batches = [token_lists[i:i + batch_size] for i in range(0, len(token_lists), batch_size)]
    tokens = sum(len(t) for t in token_lists)

    def padded(batch: list[list[int]]) -> torch.Tensor:
        ids = torch.zeros((len(batch), max(len(t) for t in batch)), dtype=torch.int64)
        for b, t in enumerate(batch):
            ids[b, : len(t)] = torch.tensor(t)
        return ids.to(device)

    def timed(forward: object) -> float:
        with torch.no_grad():
            forward(padded(batches[0]))  # type: ignore[operator]  # warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for batch in batches:
                out_ = forward(padded(batch))  # type: ignore[operator]
                # Like the job, bring the hidden states to the CPU as bf16.
                torch.stack([h.to(torch.bfloat16) for h in out_.hidden_states]).cpu()
            if device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

    full = timed(lambda ids: model(ids, output_hidden_states=True))
    base = timed(lambda ids: model.model(ids, output_hidden_states=True))
    return {"full": tokens / full, "base": tokens / base, "tokens": tokens}


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def io_child(jobs: Path, work: Path, hidden: int, layers: int, samples: int, seq_len: int) -> dict[str, float]:
    """Bytes written per byte of hidden state by a vLLM-backend extraction and by exports (this process)."""
    import random

    sys.path[:0] = [str(jobs), str(REPO / "tests")]
    from eagle3 import export, extract
    from fakes.fake_vllm import make_api

    model = work / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers,
        "hidden_size": hidden, "vocab_size": 32000, "max_position_embeddings": 2 * seq_len + 8}))
    rng = random.Random(0)
    prompts = work / "tokens.jsonl"
    lens = [rng.randint(seq_len // 2, seq_len) for _ in range(samples)]
    prompts.write_text("".join(json.dumps({"token_ids": [rng.randrange(3, 32000) for _ in range(n)]}) + "\n"
                               for n in lens))
    n_layers = len(extract.default_layer_ids(layers))
    hs_bytes = sum(lens) * n_layers * hidden * 2
    res: dict[str, float] = {"hidden_state_bytes": hs_bytes, "tokens": sum(lens)}

    def measured(key: str, fn: object) -> None:
        sink = io.StringIO()
        w0, t0 = _wchar(), time.perf_counter()
        with contextlib.redirect_stdout(sink):
            rc = fn()  # type: ignore[operator]
        res[key + "_s"] = time.perf_counter() - t0
        res[key] = (_wchar() - w0) / hs_bytes
        if rc != 0:
            raise SystemExit(f"{key} failed (exit {rc}): {sink.getvalue()[-2000:]}")

    out = work / "extract"
    measured("extract", lambda: extract.main(["--backend", "vllm", "--model", str(model), "--prompts", str(prompts),
                                               "--out", str(out), "--batch-size", "16"], vllm_api=make_api()))
    measured("export_supervise", lambda: export.main([str(out), str(work / "exp-supervise"), "--format", "supervise"]))
    try:
        import datasets  # noqa: F401
        measured("export_speculators", lambda: export.main([str(out), str(work / "exp-spec"),
                                                            "--format", "speculators"]))
    except ImportError:
        pass
    return res


def io_bench(args: argparse.Namespace) -> int:
    """Run io_child for the baseline's jobs/ and this checkout's, in subprocesses; print both."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base_jobs = Path(tmp) / "baseline"
        base_jobs.mkdir()
        tar = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "jobs"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_jobs)], input=tar, check=True)
        for label, jobs in (("before", base_jobs / "jobs"), ("after", JOBS)):
            work = Path(tmp) / label
            cmd = [sys.executable, __file__, "--io-child", str(jobs), str(work), "--hidden", str(args.hidden),
                   "--layers", str(args.layers), "--samples", str(args.samples), "--seq-len", str(args.seq_len)]
            r = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results[label] = json.loads(r.stdout.strip().splitlines()[-1])
    a = results["after"]
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; target hidden {args.hidden}, {args.layers} layers; "
          f"{args.samples} samples, {int(a['tokens'])} tokens, {a['hidden_state_bytes'] / 2**20:,.1f} MiB of "
          f"hidden state; baseline {args.baseline}\n")
    print("| step | bytes written per byte of hidden state, before | after | seconds before | after |")
    print("|---|---:|---:|---:|---:|")
    labels = {"extract": "extract (vLLM backend: staged file + into place)",
              "export_supervise": "export --format supervise", "export_speculators": "export --format speculators"}
    for key, label in labels.items():
        if key in a and key in results["before"]:
            b = results["before"]
            print(f"| {label} | {b[key]:.3f} | {a[key]:.3f} | {b[key + '_s']:.2f} | {a[key + '_s']:.2f} |")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--io-child"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("jobs", type=Path)
        ap.add_argument("work", type=Path)
        for k in ("hidden", "layers", "samples", "seq_len"):
            ap.add_argument("--" + k.replace("_", "-"), type=int)
        c = ap.parse_args(sys.argv[2:])
        print(json.dumps(io_child(c.jobs, c.work, c.hidden, c.layers, c.samples, c.seq_len)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="use the shipped prompt set this many times over")
    ap.add_argument("--io", action="store_true", help="measure bytes written per byte of hidden state instead")
    ap.add_argument("--baseline", default="db0bcc7", help="--io: the commit whose jobs/ gives the 'before' figures")
    ap.add_argument("--seq-len", type=int, default=512, help="--io: the longest prompt (lengths are L/2..L)")
    args = ap.parse_args()
    if args.io:
        if "--hidden" not in sys.argv:
            args.hidden = 2048
        return io_bench(args)
    model = build_model(args.hidden, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        prompts = prompt_set(args.repeat, Path(tmp))
        job_s, job_tokens = run_job(model, out, prompts, args.device, args.samples, args.batch_size)
        plain = plain_forward(model, out, args.device, args.samples, args.batch_size)
    job_tps = job_tokens / job_s
    # The job's figure includes its first batch (CUDA and allocator warm-up); the plain ones
    # start after a warm-up batch.  --repeat makes that first batch a small share.
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"device {args.device}; model hidden {args.hidden}, {args.layers} layers; {args.samples} samples, "
          f"{job_tokens} tokens, batch {args.batch_size}\n")
    print("| run | tokens/s | job overhead vs this |")
    print("|---|---:|---:|")
    print(f"| extract job (hf backend: forward + bf16 copy + atomic safetensors writes) | {job_tps:,.0f} | - |")
    for key, label in (("full", "plain `model(ids, output_hidden_states=True)`"),
                       ("base", "plain base model only (no lm_head)")):
        overhead = plain[key] / job_tps - 1
        print(f"| {label} | {plain[key]:,.0f} | {overhead:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
