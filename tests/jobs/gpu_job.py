"""A stand-in for `vllm serve`/offline extraction on a GPU box that has no GPU: it prints vLLM's
start-up lines (config, model init, shard loading with tqdm redraws, KV cache sizing, CUDA
graph capture, engine ready) and then a "Processed prompts" bar, and declares its GPU memory
to a fake NVML (tests/fakes/gpu_daemon.py) by writing `<holders>/<pid>`.

    gpu_job.py HOLDERS [--shards N] [--shard-s S] [--prompts P] [--prompt-s S] [--crash N:STEP ...]
               [--hang N:SHARD ...]

`--crash 1:12` makes attempt 1 die at prompt 12 (attempt 1 with a CUDA OOM, later ones with an
illegal memory access, so their fingerprints differ); `--hang 2:5` makes attempt 2 hang for good
while loading shard 5 (a stuck shard load: only the watchdog ends it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("holders")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--shard-s", type=float, default=0.3)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--prompt-s", type=float, default=0.05)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--crash", action="append", default=[], metavar="ATTEMPT:STEP")
    parser.add_argument("--hang", action="append", default=[], metavar="ATTEMPT:SHARD")
    args = parser.parse_args()
    attempt = int(os.environ.get("SUPERVISE_ATTEMPT", "job.1.x").split(".")[-2])
    crash_at = {int(a): int(s) for a, s in (c.split(":") for c in args.crash)}
    hang_at = {int(a): int(s) for a, s in (h.split(":") for h in args.hang)}
    holder = Path(args.holders) / str(os.getpid())

    def hold(mib_per_gpu: int) -> None:
        tmp = holder.with_suffix(".tmp")
        # Rank 0 holds a little more than the others, as it does with vLLM (the sampler, the API).
        tmp.write_text("".join(f"{gpu} {mib_per_gpu + (600 if gpu == 0 else 0)}\n" for gpu in range(args.gpus)))
        tmp.rename(holder)

    say = print
    say("INFO 11-29 10:00:00 [__init__.py:239] Automatically detected platform cuda.", flush=True)
    say(f"INFO 11-29 10:00:01 [core.py:70] Initializing a V1 LLM engine (v0.23.0) with config: model='tiny', "
        f"tensor_parallel_size={args.gpus}", flush=True)
    time.sleep(0.2)
    hold(900)
    say("INFO 11-29 10:00:02 [gpu_model_runner.py:1595] Starting to load model tiny...", flush=True)
    time.sleep(0.2)
    bar = "Loading safetensors checkpoint shards"
    sys.stdout.write(f"\r{bar}:   0% Completed | 0/{args.shards} [00:00<?, ?it/s]")
    sys.stdout.flush()
    for shard in range(1, args.shards + 1):
        time.sleep(3600 if hang_at.get(attempt) == shard else args.shard_s)
        hold(900 + 2600 * shard)
        pct = 100 * shard // args.shards
        sys.stdout.write(f"\r{bar}: {pct:3d}% Completed | {shard}/{args.shards} [00:0{shard}<00:00,  "
                         f"{1 / args.shard_s:.2f}it/s]")
        sys.stdout.flush()
    sys.stdout.write("\n")
    say(f"INFO 11-29 10:00:09 [default_loader.py:262] Loading weights took {args.shards * args.shard_s:.2f} seconds",
        flush=True)
    time.sleep(0.2)
    say("INFO 11-29 10:00:10 [gpu_worker.py:276] Available KV cache memory: 52.31 GiB", flush=True)
    hold(900 + 2600 * args.shards + 52000)
    time.sleep(0.3)
    for i in range(1, 5):
        sys.stdout.write(f"\rCapturing CUDA graphs (decode, FULL): {25 * i:3d}%|{'#' * i}{' ' * (4 - i)}| {i}/4 "
                         f"[00:00<00:00, 20.0it/s]")
        sys.stdout.flush()
        time.sleep(0.05)
    sys.stdout.write("\n")
    say("INFO 11-29 10:00:12 [core.py:214] init engine (profile, create kv cache, warmup model) took 2.10 s",
        flush=True)
    time.sleep(0.1)
    for step in range(1, args.prompts + 1):
        time.sleep(args.prompt_s)
        pct = 100 * step // args.prompts
        sys.stdout.write(f"\rProcessed prompts: {pct:3d}%|{'#' * (pct // 10):<10}| {step}/{args.prompts} "
                         f"[00:01<00:01, {1 / args.prompt_s:.2f}it/s]")
        sys.stdout.flush()
        if crash_at.get(attempt) == step:
            sys.stdout.write("\n")
            say("Traceback (most recent call last):", flush=True)
            say('  File "/opt/vllm/worker/gpu_model_runner.py", line 1820, in execute_model', flush=True)
            if attempt == 1:
                say("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                    "capacity of 79.65 GiB of which 1.20 GiB is free.", flush=True)
            else:
                say(f"RuntimeError: CUDA error: an illegal memory access was encountered (attempt {attempt})",
                    flush=True)
            sys.exit(1)
    sys.stdout.write("\n")
    say("extraction finished: 40 samples written", flush=True)


if __name__ == "__main__":
    main()
