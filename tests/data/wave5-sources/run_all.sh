#!/bin/bash
# Runs every job of this folder on a one-GPU machine and keeps each one's whole output (stdout and stderr
# together) as LOGS/NAME.log, with its exit status in LOGS/exit-codes.tsv.  Each job is started the way a
# user's job script would start it: `bash -c 'CMD'`, so what the shell itself prints (a signal's name, a
# command not found) is in the log as it would be.
#   bash run_all.sh LOGS
set -u
SRC=$(cd "$(dirname "$0")" && pwd)
LOGS=$1
mkdir -p "$LOGS"
WORK=$(mktemp -d)
cp "$SRC"/*.py "$SRC"/*.cu "$SRC"/*.cpp "$WORK"/
cd "$WORK" || exit 1
nvcc -O2 -o cudaprog cudaprog.cu || exit 1
: > "$LOGS/exit-codes.tsv"

job() {  # job NAME CMD...
  local name=$1; shift
  timeout -s KILL 240 bash -c "$*" > "$LOGS/$name.log" 2>&1
  printf '%s\t%s\t%s\n' "$name" "$?" "$*" >> "$LOGS/exit-codes.tsv"
}

signalled() {  # signalled NAME SIGNAL AFTER_S CMD...: the job's own shell gets SIGNAL after AFTER_S seconds
  local name=$1 sig=$2 after=$3; shift 3
  bash -c "$*" > "$LOGS/$name.log" 2>&1 &
  local pid=$!
  sleep "$after"
  # the signal goes to the program the shell started (as a terminal's Ctrl-C or a scheduler would)
  pkill "-$sig" -P "$pid"
  wait "$pid"
  printf '%s\t%s\t%s (%s after %ss)\n' "$name" "$?" "$*" "$sig" "$after" >> "$LOGS/exit-codes.tsv"
}

job lightning-fit-done "python3 lit.py done"
job lightning-oom-epoch1 "python3 lit.py oom"
job lightning-devices-4-on-1-gpu "python3 lit.py devices"
job lightning-val-keyerror-sanity "python3 lit.py val-keyerror"
job jax-steps-done "python3 jx.py done"
job jax-oom-step-120 "python3 jx.py oom"
job jax-shape-error-jit "python3 jx.py shape"
job accelerate-launch-done "accelerate launch --num_processes 1 acc_train.py done"
job accelerate-launch-valueerror-step "accelerate launch --num_processes 1 acc_train.py bad-label"
job accelerate-launch-missing-script "accelerate launch --num_processes 1 train_sft.py --epochs 3"
job hf-trainer-tiny-llama-done-shards "python3 hf_tiny.py done"
job hf-trainer-oom-first-step "python3 hf_tiny.py oom"
job cupy-fft-oom "python3 cupy_oom.py"
job triton-reshape-compile-error "python3 triton_bad.py"
job cuda-cpp-done "./cudaprog done"
job cuda-cpp-malloc-oom "./cudaprog oom"
job cuda-cpp-illegal-address "./cudaprog illegal"
job cuda-cpp-uncaught-throw "echo starting check; ./cudaprog throw"
job cuda-cpp-host-segfault "echo starting check; ./cudaprog segv"
job torch-loop-done-complete-marker "python3 tloop.py done"
job torch-loop-oom-growing-batch "python3 tloop.py oom-epoch"
job torch-resume-chained-error "python3 tloop.py resume-chain"
job torch-error-during-handling "python3 tloop.py cleanup-chain"
job torch-config-systemexit "python3 tloop.py config-exit"
job torch-cross-entropy-device-assert "python3 tloop.py ce-assert"
job torchrun-1proc-done "torchrun --nproc_per_node 1 tloop.py done"
job torchrun-1proc-resume-chained "torchrun --nproc_per_node 1 tloop.py resume-chain"
job shell-tune-command-not-found "echo 'launching finetune'; tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device"
job shell-python-nonexistent-script "python3 nonexistent.py"
job shell-python-m-missing-module "python3 -m lm_eval --model hf --model_args pretrained=gpt2 --tasks hellaswag"
job shell-python-m-missing-package-submodule "python3 -m axolotl.cli.train examples/llama-3/lora-1b.yml"
job shell-cd-missing-dir "cd /data/run7 && python3 tloop.py done"
signalled torch-loop-sigint-iter "INT" 12 "python3 tloop.py long; echo after"
signalled torch-loop-sigterm-iter "TERM" 12 "python3 tloop.py long; echo after"
signalled torch-loop-sigkill-percent "KILL" 15 "python3 tloop.py percent; echo after"
signalled torchrun-sigint-iter "INT" 20 "torchrun --nproc_per_node 1 tloop.py long; echo after"
