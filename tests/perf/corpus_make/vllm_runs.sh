#!/usr/bin/env bash
# Real vLLM 0.23 logs for the probe corpus, on one GPU, after vllm_install.sh (tests/perf/corpus_make/README.md).
#   OUT=/some/dir bash tests/perf/corpus_make/vllm_runs.sh A|B     -> $OUT/vllm-logs-A|B.tar.gz
# Each log is the command's stdout+stderr as `cmd > log 2>&1` keeps them.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE=$(cd "$(dirname "$0")" && pwd)
M=/tmp/m LOGS=/tmp/vllm-corpus-logs
mkdir -p "$LOGS" "${OUT:-/tmp/out}"
[ -d $M/tiny-deepseek ] || python3 "$HERE/vllm_models.py" $M > /tmp/models.log 2>&1 || cat /tmp/models.log
VLLM="python3 -m vllm.entrypoints.cli.main"
run() {  # run NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  echo "=== $(date +%T) $name: $*"
  timeout -s KILL "$secs" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $(date +%T) $name exit $rc"
}
wait_health() {  # wait_health PORT SECONDS
  for _ in $(seq "$2"); do curl -sf "127.0.0.1:$1/health" > /dev/null && return 0; sleep 1; done; return 1
}
serve_then() {  # serve_then NAME ACTION ARGS... : start `vllm serve` in its own group, wait until ready, then ACTION
  local name=$1 action=$2; shift 2
  echo "=== $(date +%T) $name: serve $*"
  setsid $VLLM serve "$@" --port 8011 > "$LOGS/$name.log" 2>&1 &
  local pid=$!
  if wait_health 8011 240; then
    curl -s 127.0.0.1:8011/v1/completions -H 'Content-Type: application/json' \
      -d "{\"model\": \"$1\", \"prompt\": [11, 12, 13, 14, 15, 16], \"max_tokens\": 16}" > /dev/null
    if [ "$action" = int ]; then kill -INT "$pid"; else
      engine=$(pgrep -P "$pid" | head -1); echo "SIGKILL engine pid $engine"; kill -9 "$engine"; fi
  else echo "not ready"; fi
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 -- -"$pid" 2>/dev/null; wait "$pid"
  local rc=$?
  echo "=== $(date +%T) $name exit $rc"
}
case "${1:-A}" in
A)
  serve_then vllm-serve-llama-ready-sigint int $M/tiny-llama --skip-tokenizer-init --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.3
  run vllm-offline-deepseek-mla-moe-done 200 python3 "$HERE/vllm_offline.py" $M/tiny-deepseek gpu_memory_utilization=0.3
  run vllm-offline-llama-fp8-done 200 python3 "$HERE/vllm_offline.py" $M/tiny-llama quantization="'fp8'" gpu_memory_utilization=0.3
  ;;
B)
  run vllm-serve-max-model-len-too-long 120 $VLLM serve $M/tiny-llama --skip-tokenizer-init --enforce-eager --max-model-len 65536 --port 8012
  run vllm-offline-tp2-one-gpu 150 python3 "$HERE/vllm_offline.py" $M/tiny-llama tensor_parallel_size=2 gpu_memory_utilization=0.3
  run vllm-serve-kv-cache-no-memory 150 $VLLM serve $M/tiny-llama --skip-tokenizer-init --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.004 --port 8013
  serve_then vllm-serve-deepseek-engine-sigkill kill $M/tiny-deepseek --skip-tokenizer-init --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.3
  python3 -c "import torch,time; b=torch.empty(120<<30,dtype=torch.uint8,device='cuda'); print('held',flush=True); time.sleep(200)" &
  hog=$!; sleep 15
  run vllm-serve-gpu-memory-taken 120 $VLLM serve $M/tiny-llama --skip-tokenizer-init --enforce-eager --max-model-len 2048 --port 8014
  kill "$hog"
  ;;
esac
tar -C "$LOGS" -czf "${OUT:-/tmp/out}/vllm-logs-$1.tar.gz" .
ls -la "$LOGS"
