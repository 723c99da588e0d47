#!/usr/bin/env bash
# Real logs for the probe corpus: each run of corpus_job.py (torch, torchrun, transformers,
# Lightning on one GPU) with stdout and stderr together, as `cmd > log 2>&1` keeps them.
#   OUT=/some/dir bash tests/perf/gpu/corpus_runs.sh      -> $OUT/corpus-logs.tar.gz
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
JOB="$HERE/corpus_job.py"
LOGS=/tmp/corpus-logs
mkdir -p "$LOGS" "${OUT:-/tmp/out}"
cd /tmp
run() {  # run NAME COMMAND...
  local name=$1; shift
  echo "=== $name: $*"
  timeout -s KILL 120 "$@" > "$LOGS/$name.log" 2>&1
  echo "=== $name exit $?"
}
TR="torchrun --nproc_per_node 2 --log-dir /tmp/tl --tee 3"
run torchrun-ddp-gloo-2rank-done $TR "$JOB" ddp-ok
run torchrun-rank1-valueerror-startup $TR "$JOB" ddp-config-error
run torchrun-rank0-sigkill $TR "$JOB" ddp-sigkill
run torchrun-gloo-collective-timeout $TR "$JOB" collective-timeout
run torchrun-nccl-duplicate-gpu $TR "$JOB" nccl-duplicate-gpu --backend nccl
run torch-store-timeout python3 "$JOB" store-timeout
run torch-cuda-oom-training python3 "$JOB" oom
run torch-device-side-assert python3 "$JOB" device-assert
run torchrun-fsdp-nccl-debug-done env NCCL_DEBUG=INFO torchrun --nproc_per_node 1 "$JOB" fsdp --backend nccl
run hf-trainer-eval-bars-done python3 "$JOB" hf-trainer
run hf-trainer-oom python3 "$JOB" hf-trainer-oom
run hf-config-valueerror python3 "$JOB" hf-config-error
run lightning-fit-done python3 "$JOB" lightning
run lightning-setup-assert python3 "$JOB" lightning-assert
run bash-killed-child bash -c "python3 $JOB suicide; echo exit=\$?"
run python-import-error python3 -c "import flash_attn_interface"
run python-segfault python3 -X faulthandler -c "import ctypes; print('calling', flush=True); ctypes.string_at(0)"
tar -C "$LOGS" -czf "${OUT:-/tmp/out}/corpus-logs.tar.gz" .
ls -la "$LOGS"
