#!/usr/bin/env bash
# Real logs of older vLLM releases, SGLang and Megatron on this CPU-only machine (no GPU), for the probe
# corpus (tests/data/corpus/run-logs-2/).  Each program lives in its own venv under /tmp:
#   /tmp/cv_vllm063  pip install vllm==0.6.3.post1      /tmp/cv_vllm085  pip install vllm==0.8.5
#   /tmp/cv_sglang   pip install "sglang[srt]"          /tmp/cv_mcore    pip install megatron-core torch
# and Megatron-LM's source tree (its pretrain_gpt.py) unpacked at /tmp/megatron-lm.
#   bash tests/perf/corpus_make/other_runs.sh [vllm|sglang|mcore]...   -> /tmp/other-corpus-logs/*.log
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGS=/tmp/other-corpus-logs
MODEL=/tmp/m/tiny-llama
mkdir -p "$LOGS" /tmp/other-corpus
cd /tmp/other-corpus
run() {  # run NAME COMMAND...   (stdout and stderr together, as `cmd > log 2>&1` keeps them)
  local name=$1; shift
  echo "=== $name: $*"
  timeout -s KILL 600 "$@" > "$LOGS/$name.log" 2>&1
  echo "=== $name exit $?"
}
[ -f $MODEL/config.json ] || /work/main/.venv/bin/python "$HERE/tiny_model_dir.py" $MODEL
# Offline: LLM(model) then generate, as a user's first script does.
OFFLINE="from vllm import LLM, SamplingParams
llm = LLM(model='$MODEL', max_model_len=512)
print(llm.generate(['the model learns'], SamplingParams(max_tokens=8)))"
for what in ${@:-vllm sglang mcore}; do case $what in
vllm)
  for v in 063 085; do
    run vllm-$v-serve /tmp/cv_vllm$v/bin/vllm serve $MODEL --max-model-len 512 --port 8031
    run vllm-$v-offline /tmp/cv_vllm$v/bin/python -c "$OFFLINE"
    run vllm-$v-serve-device-cpu /tmp/cv_vllm$v/bin/vllm serve $MODEL --max-model-len 512 --port 8031 --device cpu
  done ;;
sglang)
  run sglang-launch-server /tmp/cv_sglang/bin/python -m sglang.launch_server --model-path $MODEL --port 8032
  run sglang-launch-server-device-cpu /tmp/cv_sglang/bin/python -m sglang.launch_server --model-path $MODEL \
    --port 8032 --device cpu ;;
mcore)
  TR="/tmp/cv_mcore/bin/torchrun --nproc_per_node 2"
  for mode in train cuda-seed tp-heads; do run mcore-$mode $TR "$HERE/mcore_job.py" $mode; done
  # Megatron-LM's own trainer on mock data, as its examples start it (a GPT of 2 layers).
  cd /tmp/megatron-lm
  GPT="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
    --micro-batch-size 2 --global-batch-size 4 --train-iters 20 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer
    --vocab-size 128 --log-interval 1 --eval-iters 0 --save /tmp/other-corpus/megatron-ckpt"
  run megatron-lm-pretrain-gpt $TR pretrain_gpt.py $GPT
  run megatron-lm-pretrain-gpt-gloo-cpu $TR pretrain_gpt.py $GPT --distributed-backend gloo --use-cpu-initialization \
    --no-gradient-accumulation-fusion --transformer-impl local
  cd /tmp/other-corpus ;;
esac; done
ls -la "$LOGS"
