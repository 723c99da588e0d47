#!/usr/bin/env bash
# On the GPU machine: a small target trained there (e2e_target.py --size small), its hidden states (eagle3.extract,
# hf backend on CUDA), a draft (eagle3.train on CUDA), the draft written by `eagle3.speculators_ckpt` (the
# speculators format: `layers.0.*`, no fc.bias, the verifier recorded from the extraction's model); then vLLM 0.23,
# installed from the carried pieces, serves the target with that exported directory as
# `--speculative-config '{"method": "eagle3", "model": DRAFT, ...}'`, measured by e2e_bench.py (vLLM's own
# /metrics counters), then the target alone for the greedy comparison. vLLM's own log lines
# ("SpecDecoding metrics: ...") stay in the server logs.
#   W=/tmp/exported OUT=/out PHASES="build serve" bash tests/perf/gpu/exported_draft_serve.sh
# Run from the repository root (jobs/ on the path). e2e_target.py and e2e_bench.py are read beside this script.
# The vLLM wheels: /tmp/parts/piece.* (one tar of every wheel, split to fit the carry limit; the tar holds
# pk/SHA256SUMS). Knobs: K (3 speculative tokens), LABELS ("draft none"), BENCH_ARGS, TARGET_STEPS (800),
# EXTRACT_N (2000), EPOCHS (6).
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(pwd)
W=${W:-/tmp/exported}
OUT=${OUT:-/tmp/exported-out}
DEVICE=${DEVICE:-cuda} K=${K:-3} TARGET_STEPS=${TARGET_STEPS:-800} EXTRACT_N=${EXTRACT_N:-2000} EPOCHS=${EPOCHS:-6}
mkdir -p "$OUT" "$W"
say() { echo "=== $(date +%T) $*"; }

phase_build() {
  say "target: e2e_target.py build --size small, then prompts"
  PYTHONPATH=$REPO/jobs python3 "$HERE/e2e_target.py" build "$W/target" --size small --docs "${DOCS:-20000}" --seq 256 \
    --batch 32 --steps "$TARGET_STEPS" --lr 2e-3 2>&1 | grep -v "Writing model shards" > "$OUT/target-build.log" \
    || { tail -20 "$OUT/target-build.log"; return 1; }
  tail -2 "$OUT/target-build.log"
  PYTHONPATH=$REPO/jobs python3 "$HERE/e2e_target.py" prompts "$W/target" --extract "$EXTRACT_N" --bench 64 \
    | tee -a "$OUT/target-build.log" || return 1
  cp "$W/target/config.json" "$OUT/target-config.json"; cp "$W/target/e2e_target.json" "$OUT/"
  say "extract (hf backend, cuda)"
  PYTHONPATH=$REPO/jobs python3 -m eagle3.extract --model "$W/target" --prompts "$W/target/extract.jsonl" \
    --out "$W/extract" --device "$DEVICE" --layer-ids 1,2,3,4 > "$OUT/extract.log" 2>&1 || { tail -20 "$OUT/extract.log"; return 1; }
  tail -1 "$OUT/extract.log"
  say "train (cuda)"
  PYTHONPATH=$REPO/jobs python3 -m eagle3.train --data "$W/extract" --out "$W/train" --device "$DEVICE" \
    --epochs "$EPOCHS" --batch-size 32 --draft-vocab 32000 --lr 3e-4 --log-every 50 > "$OUT/train.log" 2>&1 \
    || { tail -20 "$OUT/train.log"; return 1; }
  tail -2 "$OUT/train.log"
  say "export: eagle3.speculators_ckpt"
  rm -rf "$W/draft-speculators"
  PYTHONPATH=$REPO/jobs python3 -m eagle3.speculators_ckpt "$W/train" "$W/draft-speculators" | tee "$OUT/export.log"
  cp "$W/draft-speculators/config.json" "$OUT/draft-speculators-config.json"
  cp "$W/train/train_info.json" "$OUT/"
  PYTHONPATH=$REPO/jobs python3 -c "
import sys; from safetensors import safe_open
f = safe_open(sys.argv[1], 'pt')
for k in sorted(f.keys()): print(k, list(f.get_slice(k).get_shape()))" "$W/draft-speculators/model.safetensors" \
    | tee "$OUT/draft-speculators-tensors.txt"
}

phase_serve() {
if [ ! -f /tmp/site/.installed ]; then
  say "install vLLM from $(ls /tmp/parts/piece.* | wc -l) pieces"
  mkdir -p /tmp/whl && cat /tmp/parts/piece.* | tar xf - -C /tmp/whl || exit 1
  (cd /tmp/whl && sha256sum --quiet -c pk/SHA256SUMS) || { echo "wheel checksum mismatch"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/whl/*.whl \
    || exit 1
  touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"

server=""
stop_server() { [ -n "$server" ] && kill -TERM -- "-$server" 2>/dev/null; sleep 3; [ -n "$server" ] && \
  kill -KILL -- "-$server" 2>/dev/null; server=""; }
trap stop_server EXIT

serve_one() {  # $1 label, $2 draft dir or empty
  local spec=()
  [ -n "$2" ] && spec=(--speculative-config "{\"method\": \"eagle3\", \"model\": \"$2\", \"num_speculative_tokens\": $K}")
  say "serve $1 ${2:+(draft $2)}"
  local t0=$SECONDS
  setsid python3 -c "from vllm.entrypoints.cli.main import main; main()" serve "$W/target" --port 8011 \
    --gpu-memory-utilization 0.3 --max-model-len 2048 --seed 0 --enforce-eager "${spec[@]}" \
    > "$OUT/serve-$1.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    curl -sf http://127.0.0.1:8011/health >/dev/null && break
    kill -0 "$server" 2>/dev/null || { say "serve $1 died"; tail -40 "$OUT/serve-$1.log"; server=""; return 1; }
    sleep 1
  done
  say "serve $1 ready after $((SECONDS - t0)) s"
  python3 "$HERE/e2e_bench.py" --port 8011 --prompts "$W/target/bench.jsonl" --label "$1" --out "$OUT" ${BENCH_ARGS:-}
  curl -s http://127.0.0.1:8011/metrics | grep -E '^vllm:spec_decode' > "$OUT/metrics-$1.txt"
  sleep 11  # vLLM logs its SpecDecoding metrics line every 10 s
  stop_server
  grep -E "SpecDecoding metrics|Loading|eagle|Eagle|speculat|Error|error" "$OUT/serve-$1.log" | tail -40
}

for label in ${LABELS:-draft none}; do
  case $label in draft) serve_one draft "$W/draft-speculators" ;; none) serve_one none "" ;; esac
done
}

for p in ${PHASES:-build serve}; do "phase_$p" || { say "phase $p failed"; exit 1; }; done
say "done: ${PHASES:-build serve}"
