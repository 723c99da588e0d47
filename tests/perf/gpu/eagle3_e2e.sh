#!/usr/bin/env bash
# EAGLE-3 end to end on one GPU: a small target trained here (e2e_target.py), the real pipeline under
# supervise (extract with the vLLM backend on held-apart prompts, then the draft's training), once on the
# whole prompt set and once on a quarter of it, then `vllm serve` of the target without a draft, with the
# draft and with the quarter draft, each under supervise, measured by e2e_bench.py (vLLM's own
# speculative-decoding counters; tokens/s at batch 1 and 8, greedy and temperature 0.7).
# Run from the repo root on the GPU machine, after the vLLM wheels were copied to /tmp/parts (with the
# supervise venv's wheels in /tmp/parts/sv: on a networked machine, `pip download -d DIR --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any` of
# pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise prometheus-client
# rich, carried over with the vLLM parts), in four calls of under 5 minutes each on an H200 (140, 165, 71 and
# 297 s in the run of tests/perf/results/eagle3-e2e-h200/):
#   PHASES="setup target" OUT=/dir bash tests/perf/gpu/eagle3_e2e.sh
#   PHASES="full"         OUT=/dir bash tests/perf/gpu/eagle3_e2e.sh
#   PHASES="quarter"      OUT=/dir bash tests/perf/gpu/eagle3_e2e.sh
#   PHASES="serve table"  OUT=/dir bash tests/perf/gpu/eagle3_e2e.sh
# Knobs: TARGET_STEPS (1200), EXTRACT_N (3000), EPOCHS (6), BATCH (32), K (3 speculative tokens),
# SERVE_LABELS ("none draft quarter"), SERVE_EAGER (set: --enforce-eager), BENCH_ARGS (e2e_bench.py options).
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
REPO=$(pwd)
OUT=${OUT:-/tmp/e2e-out}
W=${WORK:-/tmp/e2e}
T=$W/target
PHASES=${PHASES:-setup target full quarter serve table}
BACKEND=${BACKEND:-vllm} DEVICE=${DEVICE:-cuda}
TARGET_STEPS=${TARGET_STEPS:-1200} EXTRACT_N=${EXTRACT_N:-3000} EPOCHS=${EPOCHS:-6} BATCH=${BATCH:-32} K=${K:-3}
JOBPY=${JOBPY:-$(command -v python3)}
export SUPERVISE_HOME=$W/svh SUPERVISE_GPU_INTERVAL_S=0.5
mkdir -p "$OUT" "$W"
say() { echo "=== $(date +%T) $*"; }
SV() { PYTHONPATH=$REPO /tmp/sv/bin/python -m supervisor.cli "$@"; }
keep() {  # a job's events and logs into $OUT
  SV events "$1" --json > "$OUT/$1-events.json" 2>/dev/null
  mkdir -p "$OUT/logs/$1"; cp "$SUPERVISE_HOME"/logs/"$1"/*.log "$OUT/logs/$1/" 2>/dev/null
}

phase_setup() {
  say "supervise venv and vLLM"
  [ -x /tmp/sv/bin/python ] || { python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index \
    --find-links /tmp/parts/sv pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx \
    apprise prometheus-client rich; } || exit 1
  bash "$REPO/.vllm/part6/vllm-install.sh" || exit 1
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
}

phase_target() {
  say "target: build and train (seeded), then the held-apart prompt sets"
  [ -f "$T/e2e_target.json" ] || PYTHONPATH=$REPO/jobs $JOBPY "$REPO/tests/perf/gpu/e2e_target.py" build "$T" ${TARGET_ARGS:-} \
    --steps "$TARGET_STEPS" 2>&1 | grep -v "Writing model shards" | tee "$OUT/target-build.log" | grep -E "corpus|model:|step [0-9]*000/|saved"
  PYTHONPATH=$REPO/jobs $JOBPY "$REPO/tests/perf/gpu/e2e_target.py" prompts "$T" --extract "$EXTRACT_N" --bench 64 \
    | tee -a "$OUT/target-build.log"
  cp "$T/e2e_target.json" "$T/config.json" "$OUT/"
  ls -la "$T" > "$OUT/target-files.txt"
}

pipeline() {  # $1 label, $2 prompt set: the eagle3 pipeline (extract -> train) under supervise
  say "pipeline $1: extract (vllm) -> train, prompts $(wc -l < "$2")"
  local vocab; vocab=$($JOBPY -c "import json; print(json.load(open('$T/config.json'))['vocab_size'])")
  SV start eagle3 --set model="$T" --set out="$W/$1" --set device="$DEVICE" --python "$JOBPY" \
    --set extract.backend="$BACKEND" --set extract.prompts="$2" --set extract.pythonpath=/tmp/site \
    --set train.epochs="$EPOCHS" --set train.batch_size="$BATCH" --set train.draft_vocab="$vocab" \
    --set train.lr=3e-4 --set train.save_every=500 --follow 2>&1 | grep -v "progress" | tail -12
  SV status eagle3 | tee "$OUT/$1-status.txt"
  mkdir -p "$OUT/$1"
  for j in eagle3.extract eagle3.train; do keep "$j"; mv "$OUT/$j-events.json" "$OUT/$1/"; \
    rm -rf "$OUT/$1/logs-$j"; mv "$OUT/logs/$j" "$OUT/$1/logs-$j"; done
  cp "$W/$1/extract/manifest.json" "$OUT/$1/extract-manifest.json"
  cp "$W/$1/train/train_info.json" "$W/$1/train/config.json" "$OUT/$1/" 2>/dev/null
}
phase_full() { pipeline full "$T/extract.jsonl"; }
phase_quarter() { pipeline quarter "$T/extract_quarter.jsonl"; }

serve_one() {  # $1 label, $2 draft dir or empty
  local spec="$W/serve-$1.toml" extra="" eager=""
  [ -n "${SERVE_EAGER:-}" ] && eager=', "--enforce-eager"'
  [ -n "$2" ] && extra=", \"--speculative-config\", '{{\"method\": \"eagle3\", \"model\": \"$2\", \"num_speculative_tokens\": $K}}'"
  cat > "$spec" <<TOML
name = "serve-$1"
python = "$JOBPY"
command = ["{python}", "-c", "from vllm.entrypoints.cli.main import main; main()", "serve", "$T", "--port", "8011",
           "--gpu-memory-utilization", "0.3", "--max-model-len", "2048", "--seed", "0"$eager$extra]
probes = ["python", "cuda", "nccl", "vllm", "uvicorn", "tqdm"]
stop_grace_s = 10
[env]
PYTHONPATH = "/tmp/site"
[restart]
max_attempts = 1
TOML
  say "serve $1 ${2:+(draft $2)}"
  SV start "$spec" || return 1
  for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  say "serve $1 ready"
  $JOBPY "$REPO/tests/perf/gpu/e2e_bench.py" --port 8011 --prompts "$T/bench.jsonl" --label "$1" --out "$OUT/bench" ${BENCH_ARGS:-}
  SV status "serve-$1" > "$OUT/serve-$1-status.txt"
  SV stop "serve-$1"
  keep "serve-$1"
}
phase_serve() {
  for label in ${SERVE_LABELS:-none draft quarter}; do
    case $label in none) serve_one none "" ;; draft) serve_one draft "$W/full/train" ;;
                   quarter) serve_one quarter "$W/quarter/train" ;; esac
  done
}

phase_table() {
  $JOBPY "$REPO/tests/perf/gpu/e2e_table.py" "$OUT" | tee "$OUT/e2e.md"
}

for p in $PHASES; do "phase_$p"; done
say "done: $PHASES"
