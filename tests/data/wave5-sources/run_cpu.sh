#!/bin/bash
# The CPU-only counterpart of run_all.sh, for a machine without a GPU: the same jobs where they can run on
# a CPU, each one's whole output (stdout and stderr together) kept as LOGS/NAME.log, its exit status in
# LOGS/exit-codes.tsv.  Each job is started as `bash -c 'CMD'`, as a user's job script would start it.
#   PATH=ENV/bin:$PATH bash run_cpu.sh LOGS
set -u
SRC=$(cd "$(dirname "$0")" && pwd)
LOGS=$1
mkdir -p "$LOGS"
WORK=$(mktemp -d)
cp "$SRC"/*.py "$SRC"/*.cu "$SRC"/*.cpp "$WORK"/
cd "$WORK" || exit 1
nvcc -O2 -o cudaprog cudaprog.cu || exit 1
g++ -O2 -o cpp_job cpp_job.cpp || exit 1
: > "$LOGS/exit-codes.tsv"

job() {  # job NAME CMD...
  local name=$1; shift
  timeout -s KILL 300 bash -c "$*" > "$LOGS/$name.log" 2>&1
  printf '%s\t%s\t%s\n' "$name" "$?" "$*" >> "$LOGS/exit-codes.tsv"
}

signalled() {  # signalled NAME SIGNAL AFTER_S CMD...: the program the job's shell started gets SIGNAL
  local name=$1 sig=$2 after=$3; shift 3
  bash -c "$*" > "$LOGS/$name.log" 2>&1 &
  local pid=$!
  sleep "$after"
  pkill "-$sig" -P "$pid"
  wait "$pid"
  printf '%s\t%s\t%s (%s after %ss)\n' "$name" "$?" "$*" "$sig" "$after" >> "$LOGS/exit-codes.tsv"
}

job lightning-cpu-fit-done "python3 lit.py done"
job lightning-gpu-asked-on-cpu-host "python3 lit.py devices"
job lightning-val-keyerror-sanity "python3 lit.py val-keyerror"
job jax-cpu-steps-done "python3 jx.py done"
job jax-cpu-shape-error-jit "python3 jx.py shape"
job accelerate-launch-cpu-done "accelerate launch --cpu --num_processes 1 acc_train.py done"
job accelerate-launch-valueerror-step "accelerate launch --cpu --num_processes 1 acc_train.py bad-label"
job accelerate-launch-missing-script "accelerate launch --cpu --num_processes 1 train_sft.py --epochs 3"
job cuda-cpp-no-device "./cudaprog done"
job cpp-job-uncaught-throw "echo 'summing shards'; ./cpp_job missing"
job cpp-job-done "./cpp_job done"
job torch-loop-done-complete-marker "python3 tloop.py done"
job torch-resume-chained-error "python3 tloop.py resume-chain"
job torch-error-during-handling "python3 tloop.py cleanup-chain"
job torch-config-systemexit "python3 tloop.py config-exit"
job torch-cross-entropy-target-out-of-bounds "python3 tloop.py ce-assert"
job torchrun-1proc-done "torchrun --nproc_per_node 1 tloop.py done"
job torchrun-1proc-resume-chained "torchrun --nproc_per_node 1 tloop.py resume-chain"
job shell-tune-command-not-found "echo 'launching finetune'; tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device"
job shell-python-nonexistent-script "python3 nonexistent.py"
job shell-python-m-missing-module "python3 -m lm_eval --model hf --model_args pretrained=gpt2 --tasks hellaswag"
job shell-python-m-missing-package-submodule "python3 -m axolotl.cli.train examples/llama-3/lora-1b.yml"
job shell-cd-missing-dir "cd /data/run7 && python3 tloop.py done"
signalled torch-loop-sigint-iter "INT" 15 "python3 tloop.py long; echo after"
signalled torch-loop-sigterm-iter "TERM" 15 "python3 tloop.py long; echo after"
signalled torch-loop-sigkill-percent "KILL" 20 "python3 tloop.py percent; echo after"
signalled torchrun-sigint-iter "INT" 25 "torchrun --nproc_per_node 1 tloop.py long; echo after"
job lightning-cpu-alloc-fails-epoch1 "python3 lit.py oom"
signalled lightning-ctrl-c-mid-fit "INT" 25 "python3 lit.py long; echo after"
job torchrun-2proc-systemexit-both-ranks "torchrun --nproc_per_node 2 tloop.py config-exit"
job hf-trainer-tiny-llama-done-shards "python3 hf_tiny.py done"
job cpp-job-abort-then-next-step "./cpp_job missing && python3 tloop.py done"
