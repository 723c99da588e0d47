#!/usr/bin/env bash
# Tensor-parallel vLLM (TP=2) under supervise on 2 H200s: one worker SIGKILLed mid-run, then one worker
# frozen (SIGSTOP) during shard loading.  Run from the repo root on the GPU machine after the vLLM wheels were
# copied to /tmp/parts:   OUT=/some/dir STEP=kill|freeze bash tests/perf/gpu/run_tp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
REPO=$(pwd); OUT=${OUT:-/tmp/tp-out}; STEP=${STEP:-kill}; mkdir -p "$OUT"
JOBPY=$(command -v python3)
export SUPERVISE_HOME=/tmp/svh-$STEP SUPERVISE_GPU_INTERVAL_S=0.25 SUPERVISE_GPU_STORE_EVERY_S=0.25
say() { echo "=== $(date +%T.%N | cut -c1-12) $*"; }
if [ ! -x /tmp/sv/bin/python ]; then
  python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$REPO/.vllm/sv" \
    pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise || exit 1
fi
SV() { PYTHONPATH=$REPO /tmp/sv/bin/python -m supervisor.cli "$@"; }
bash "$REPO/.vllm/part6/vllm-install.sh" >/dev/null 2>&1 || bash /tmp/parts/vllm-install.sh
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv | tee "$OUT/$STEP-nvidia-smi-before.csv"
wait_ready() {  # wait_ready JOB N: until N "Application startup complete" events exist
  for i in $(seq 1 300); do
    n=$(SV events "$1" --json 2>/dev/null | grep -c "Application startup complete"); [ "$n" -ge "$2" ] && return 0; sleep 0.5
  done; return 1
}
spec() {  # spec NAME MODEL EXTRA_ARGS...
  local name=$1 model=$2; shift 2
  local extra=""; for a in "$@"; do extra="$extra, \"$a\""; done
  cat > /tmp/$name.toml <<TOML
name = "$name"
python = "$JOBPY"
command = ["{python}", "-c", "from vllm.entrypoints.cli.main import main; main()", "serve", "$model",
           "--port", "8012", "--tensor-parallel-size", "2", "--enforce-eager", "--max-model-len", "2048",
           "--gpu-memory-utilization", "0.4"$extra]
probes = ["python", "cuda", "nccl", "vllm", "uvicorn", "tqdm"]
stop_grace_s = 5
[env]
PYTHONPATH = "/tmp/site"
[restart]
max_attempts = 2
backoff_initial_s = 1
backoff_jitter_s = 0
[health]
stall_floor_s = 5
[gpu]
release_timeout_s = 90
release_tolerance_mib = 512
TOML
}
if [ "$STEP" = kill ]; then
  (cd jobs && $JOBPY -m eagle3.tiny_model /tmp/models/tiny-llama) >/dev/null 2>&1
  spec tp /tmp/models/tiny-llama
  say "start TP=2"; SV start /tmp/tp.toml
  wait_ready tp 1 && say "ready"
  SV status tp | tee "$OUT/kill-status-ready.txt"
  LOG=$(SV status tp --json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['attempt']['log_path'])")
  W1=$(grep -ao "Worker_TP1 pid=[0-9]*" "$LOG" | head -1 | cut -d= -f2)
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv | tee "$OUT/kill-gpu-apps-before.txt"
  ps -eo pid,ppid,pgid,cmd | grep -v grep | grep -E "vllm|spawn" | cut -c1-160 >> "$OUT/kill-gpu-apps-before.txt"
  say "kill -9 worker $W1"; kill -9 "$W1"
  wait_ready tp 2 && say "relaunched and ready again"
  SV stop tp
  SV attempts tp | tee "$OUT/kill-attempts.txt"
  SV events tp | grep -E "launched|exited|verdict|action|failure" | cut -c1-260 | tee "$OUT/kill-events.txt"
  SV events tp --json > "$OUT/kill-events.jsonl"
else
  $JOBPY tests/perf/gpu/big_model.py /tmp/models/big-llama
  spec frz /tmp/models/big-llama --skip-tokenizer-init
  say "start TP=2 (6.7B, 13 shards)"; SV start /tmp/frz.toml
  LOG=$(SV status frz --json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['attempt']['log_path'])")
  /tmp/sv/bin/python tests/perf/gpu/freeze_worker.py "$LOG" 4 | tee "$OUT/freeze-when.txt"
  wait_ready frz 1 && say "ready (after the relaunch)"
  SV stop frz
  SV attempts frz | tee "$OUT/freeze-attempts.txt"
  SV events frz | grep -E "launched|exited|verdict|action|failure|shards" | cut -c1-260 | tee "$OUT/freeze-events.txt"
fi
PYTHONPATH=$REPO /tmp/sv/bin/python tests/perf/gpu/analyse_gpu.py "$SUPERVISE_HOME/supervise.db" | tee "$OUT/$STEP-analysis.md"
tar czf "$OUT/$STEP-logs.tgz" -C "$SUPERVISE_HOME" logs daemon.log supervise.db 2>/dev/null
