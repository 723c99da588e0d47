#!/usr/bin/env bash
# On a GPU host with vLLM: extract (hf backend, GPU) -> train (GPU, bf16 autocast) -> load the drafts in vLLM
# and measure acceptance, for a trained draft and an untrained one. Logs go to $OUT (default /tmp/eagle3-check).
# Usage: PYTHONPATH=<vllm site>:jobs tests/perf/eagle3_gpu_check.sh [WORKDIR]
set -euo pipefail
w=${1:-/tmp/eagle3-check}
out=${OUT:-$w}
mkdir -p "$w" "$out"
py=${PYTHON:-python3}
$py -m eagle3.extract --out "$w/extract" --cache-dir "$w/models" --device cuda > "$out/extract.log" 2>&1
tail -2 "$out/extract.log"
$py -m eagle3.train --data "$w/extract" --out "$w/train" --device cuda --epochs 30 --draft-vocab 512 \
    --log-every 60 --save-every 160 > "$out/train.log" 2>&1
tail -3 "$out/train.log"
$py -m eagle3.train --data "$w/extract" --out "$w/untrained" --device cuda --max-steps 1 --lr 1e-30 \
    --draft-vocab 512 > "$out/untrained.log" 2>&1
model=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['model'])" "$w/extract/manifest.json")
$py tests/perf/eagle3_vllm_acceptance.py "$model" "$w/extract" "$w/train" "$w/untrained" > "$out/vllm.log" 2>&1 || true
grep -E "^EAGLE3|Error|error" "$out/vllm.log" | tail -20
