#!/usr/bin/env bash
# Real CPU logs for the probe corpus: each run of cpu_job.py (torchrun over gloo, FSDP, accelerate,
# TRL SFTTrainer on a tiny Llama built locally) with stdout and stderr together, as
# `cmd > log 2>&1` keeps them.  PY names the Python that has torch, transformers, accelerate, trl.
#   PY=.venv/bin/python bash tests/perf/corpus_make/cpu_runs.sh     -> /tmp/cpu-corpus-logs/*.log
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
PY=${PY:-python3}
BIN=$(dirname "$PY")
JOB="$(cd "$(dirname "$0")" && pwd)/cpu_job.py"
LOGS=/tmp/cpu-corpus-logs
mkdir -p "$LOGS" /tmp/cpu-corpus
cd /tmp/cpu-corpus
run() {  # run NAME COMMAND...
  local name=$1; shift
  echo "=== $name: $*"
  timeout -s KILL 300 "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name exit $rc"
}
TR="$BIN/torchrun --nproc_per_node 2"
run trl-sft-tiny-llama-done "$PY" "$JOB" sft
run trl-sft-bad-dataset-column "$PY" "$JOB" sft-bad-column
run accelerate-launch-cpu-done "$BIN/accelerate" launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no "$JOB" accelerate
run torchrun-fsdp2-gloo-cpu-done $TR "$JOB" fsdp
run torchrun-max-restarts-rank1-fails $TR --max-restarts 1 "$JOB" restart-fail
run torchrun-rendezvous-join-timeout "$BIN/torchrun" --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:29533 --rdzv-conf join_timeout=20 "$JOB" rendezvous
run torch-host-oom "$PY" "$JOB" host-oom
# A full disk: a 1 MiB tmpfs (needs root) holds the first checkpoint and not the second.
mkdir -p /tmp/cpu-corpus/tinyfs && mount -t tmpfs -o size=1m tmpfs /tmp/cpu-corpus/tinyfs
CKPT_DIR=/tmp/cpu-corpus/tinyfs run torch-save-disk-full "$PY" "$JOB" disk-full
rm -rf /tmp/cpu-corpus/tinyfs/*
CKPT_DIR=/tmp/cpu-corpus/tinyfs run hf-trainer-checkpoint-disk-full "$PY" "$JOB" trainer-disk-full
umount /tmp/cpu-corpus/tinyfs
# The launcher passes --local_rank=N before the script's own arguments unless told not to.
run deepspeed-launcher-local-rank-keyerror "$BIN/deepspeed" --num_gpus 1 "$JOB" deepspeed
run deepspeed-zero2-cpu "$BIN/deepspeed" --no_local_rank --num_gpus 1 "$JOB" deepspeed
# Training loops that fail mid-run in the ways real ones do.
for mode in dataloader-keyerror collate-typeerror batch-size-valueerror nan-assert missing-forward attribute-error; do
  run "loop-$mode" "$PY" "$JOB" "$mode"
done
ls -la "$LOGS"
