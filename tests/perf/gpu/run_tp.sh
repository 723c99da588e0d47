#!/usr/bin/env bash
# Tensor-parallel vLLM (TP=2) under supervise on 2 H200s: one worker SIGKILLed mid-run (kill), one worker
# frozen (SIGSTOP) during shard loading (freeze), the API server SIGKILLed so that the engine and its
# workers are re-parented to init (orphan); and two NCCL ranks where one raises and the other hangs in
# its next all-reduce (hang, no vLLM needed); rank 1 frozen while loading, so that the engine only waits
# (straggler).  Run from the repo root on the GPU machine after the vLLM
# wheels were copied to /tmp/parts:   OUT=/some/dir STEP=kill|freeze|orphan|hang|straggler bash tests/perf/gpu/run_tp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
REPO=$(pwd); OUT=${OUT:-/tmp/tp-out}; STEP=${STEP:-kill}; mkdir -p "$OUT"
JOBPY=$(command -v python3)
export SUPERVISE_HOME=/tmp/svh-$STEP SUPERVISE_GPU_INTERVAL_S=0.25 SUPERVISE_GPU_STORE_EVERY_S=0.25
say() { echo "=== $(date +%T.%N | cut -c1-12) $*"; }
if [ ! -x /tmp/sv/bin/python ]; then
  python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$REPO/.vllm/sv" \
    pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise prometheus-client rich || exit 1
fi
SV() { PYTHONPATH=$REPO /tmp/sv/bin/python -m supervisor.cli "$@"; }
[ "$STEP" = hang ] || bash "$REPO/.vllm/part6/vllm-install.sh" >/dev/null 2>&1 || bash /tmp/parts/vllm-install.sh
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
waiting_s = ${WAITING_S:-1800}
[gpu]
release_timeout_s = 90
release_tolerance_mib = 512
TOML
}
attempt_field() {  # attempt_field JOB FIELD: a field of the job's current attempt
  SV status "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['attempt']['$2'])"
}
wait_state() {  # wait_state JOB STATE SECONDS
  for i in $(seq 1 $(($3 * 2))); do
    [ "$(SV status "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['state'])")" = "$2" ] && return 0
    sleep 0.5
  done; return 1
}
save_history() {  # save_history JOB STEP: the attempts and the stored events of the job
  SV attempts "$1" | tee "$OUT/$2-attempts.txt"
  SV events "$1" | grep -E "launched|exited|verdict|action|failure|shards" | cut -c1-260 | tee "$OUT/$2-events.txt"
  SV events "$1" --json > "$OUT/$2-events.jsonl"
}
[ -d /tmp/models/tiny-llama ] || (cd jobs && $JOBPY -m eagle3.tiny_model /tmp/models/tiny-llama) >/dev/null 2>&1
if [ "$STEP" = kill ]; then
  spec tp /tmp/models/tiny-llama
  say "start TP=2"; SV start /tmp/tp.toml
  wait_ready tp 1 && say "ready"
  SV status tp | tee "$OUT/kill-status-ready.txt"
  LOG=$(attempt_field tp log_path)
  W1=$(grep -ao "Worker_TP1 pid=[0-9]*" "$LOG" | head -1 | cut -d= -f2)
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv | tee "$OUT/kill-gpu-apps-before.txt"
  ps -eo pid,ppid,pgid,cmd | grep -v grep | grep -E "vllm|spawn" | cut -c1-160 >> "$OUT/kill-gpu-apps-before.txt"
  say "kill -9 worker $W1"; kill -9 "$W1"
  wait_ready tp 2 && say "relaunched and ready again"
  SV stop tp
  save_history tp kill
elif [ "$STEP" = orphan ]; then
  spec orp /tmp/models/tiny-llama
  say "start TP=2"; SV start /tmp/orp.toml
  wait_ready orp 1 && say "ready"
  WRAPPER=$(attempt_field orp pid); API=$(pgrep -P "$WRAPPER" | head -1)
  ps -eo pid,ppid,pgid,cmd | grep -v grep | grep -E "vllm|spawn" | cut -c1-160 > "$OUT/orphan-ps-before.txt"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv >> "$OUT/orphan-ps-before.txt"
  say "kill -9 API server $API"; kill -9 "$API"; sleep 0.3
  ps -eo pid,ppid,pgid,cmd | grep -v grep | grep -E "vllm|spawn" | cut -c1-160 | tee "$OUT/orphan-ps-after-kill.txt"
  wait_ready orp 2 && say "relaunched and ready again"
  SV stop orp
  save_history orp orphan
elif [ "$STEP" = hang ]; then
  cat > /tmp/hang.toml <<TOML
name = "hang"
python = "$JOBPY"
command = ["{python}", "$REPO/tests/perf/gpu/nccl_hang.py"]
probes = ["python", "cuda", "nccl"]
stop_grace_s = 5
[health]
hang_after_failure_s = 20
[restart]
max_attempts = 3
backoff_initial_s = 1
backoff_jitter_s = 0
[gpu]
release_timeout_s = 60
TOML
  say "start 2 NCCL ranks"; SV start /tmp/hang.toml
  wait_state hang failed 240 && say "gave up"
  SV stop hang 2>/dev/null
  ps -eo pid,ppid,pgid,cmd | grep -v grep | grep nccl_hang | tee "$OUT/hang-ps-after.txt"
  save_history hang hang
elif [ "$STEP" = straggler ]; then
  # Rank 1 frozen while loading: rank 0 draws the whole bar, then the engine waits on rank 1.
  [ -d /tmp/models/big-llama ] || $JOBPY tests/perf/gpu/big_model.py /tmp/models/big-llama
  WAITING_S=90 spec strg /tmp/models/big-llama --skip-tokenizer-init
  say "start TP=2 (6.7B, 13 shards), waiting_s = 90"; SV start /tmp/strg.toml
  LOG=$(attempt_field strg log_path)
  /tmp/sv/bin/python tests/perf/gpu/freeze_worker.py "$LOG" 1 600 1 | tee "$OUT/straggler-when.txt"
  for i in $(seq 1 480); do
    SV events strg --json 2>/dev/null | grep -q '"kind":"verdict"' && break; sleep 0.5
  done
  say "verdict"; sleep 8  # the kill and the relaunch decision
  SV stop strg
  save_history strg straggler
  grep -a "shm_broadcast\|Model loading took\|Worker_TP1" "$LOG" | cut -c1-220 > "$OUT/straggler-log-lines.txt"
else
  $JOBPY tests/perf/gpu/big_model.py /tmp/models/big-llama
  spec frz /tmp/models/big-llama --skip-tokenizer-init
  say "start TP=2 (6.7B, 13 shards)"; SV start /tmp/frz.toml
  LOG=$(attempt_field frz log_path)
  /tmp/sv/bin/python tests/perf/gpu/freeze_worker.py "$LOG" 4 | tee "$OUT/freeze-when.txt"
  wait_ready frz 1 && say "ready (after the relaunch)"
  SV stop frz
  save_history frz freeze
fi
PYTHONPATH=$REPO /tmp/sv/bin/python tests/perf/gpu/analyse_gpu.py "$SUPERVISE_HOME/supervise.db" | tee "$OUT/$STEP-analysis.md"
tar czf "$OUT/$STEP-logs.tgz" -C "$SUPERVISE_HOME" logs daemon.log $(cd "$SUPERVISE_HOME" && ls supervise.db*) 2>/dev/null
