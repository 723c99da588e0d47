#!/usr/bin/env bash
# Real logs of older vLLM releases, SGLang and Megatron on this CPU-only machine (no GPU), for the probe
# corpus (tests/data/corpus/run-logs-2/).  Each program lives in its own venv under /tmp:
#   /tmp/cv_vllm063  pip install vllm==0.6.3.post1 transformers==4.46.3
#   /tmp/cv_vllm085  pip install vllm==0.8.5 transformers==4.51.3   (the transformers of each release's time)
#   /tmp/cv_sglang   pip install "sglang[srt]"          /tmp/cv_mcore    pip install megatron-core torch six einops regex
#   sentencepiece tiktoken transformers flask-restful tqdm (the last 8: Megatron-LM's imports)
# and Megatron-LM's source tree (its pretrain_gpt.py) unpacked at /tmp/megatron-lm (main) and /tmp/megatron-lm-016 (tag core_v0.16.1).
#   bash tests/perf/corpus_make/other_runs.sh [vllm|vllm-cpu|sglang|mcore]...   -> /tmp/other-corpus-logs/*.log
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
serve_int() {  # serve_int NAME COMMAND...: start a server in its own group, once /health answers send one
  # completion request, then SIGINT (as Ctrl-C would), and wait for it to end
  local name=$1; shift
  echo "=== $name: $*"
  setsid "$@" > "$LOGS/$name.log" 2>&1 &
  local pid=$! ok=
  for _ in $(seq 300); do curl -sf 127.0.0.1:8031/health > /dev/null && ok=1 && break; sleep 1; done
  if [ -n "$ok" ]; then
    curl -s 127.0.0.1:8031/v1/completions -H 'Content-Type: application/json' \
      -d "{\"model\": \"$MODEL-v4tok\", \"prompt\": \"the model learns\", \"max_tokens\": 8}"; echo
    kill -INT "$pid"
  else echo "not ready"; fi
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 -- -"$pid" 2>/dev/null; wait "$pid"
  echo "=== $name exit $?"
}
[ -f $MODEL/config.json ] || /work/main/.venv/bin/python "$HERE/tiny_model_dir.py" $MODEL
[ -f $MODEL-v4tok/config.json ] || /work/main/.venv/bin/python "$HERE/tiny_model_dir.py" $MODEL-v4tok --v4-tokenizer-class
# Offline: LLM(model) then generate, as a user's first script does.
OFFLINE="from vllm import LLM, SamplingParams
llm = LLM(model='$MODEL', max_model_len=512)
print(llm.generate(['the model learns'], SamplingParams(max_tokens=8)))"
OFFLINE_CPU="from vllm import LLM, SamplingParams
llm = LLM(model='$MODEL-v4tok', max_model_len=512, device='cpu')
print(llm.generate(['the model learns'] * 4, SamplingParams(max_tokens=8)))"
for what in ${@:-vllm vllm-cpu sglang mcore}; do case $what in
vllm)
  for v in 063 085; do
    run vllm-$v-serve /tmp/cv_vllm$v/bin/vllm serve $MODEL --max-model-len 512 --port 8031
    run vllm-$v-offline /tmp/cv_vllm$v/bin/python -c "$OFFLINE"
    run vllm-$v-serve-device-cpu /tmp/cv_vllm$v/bin/vllm serve $MODEL --max-model-len 512 --port 8031 --device cpu
  done ;;
vllm-cpu)
  # The same model with a tokenizer_config that transformers 4 can read: 0.6.3 on its CPU path goes further.
  serve_int vllm-063-serve-device-cpu-v4tok /tmp/cv_vllm063/bin/vllm serve $MODEL-v4tok --max-model-len 512 \
    --port 8031 --device cpu
  run vllm-063-offline-device-cpu-v4tok /tmp/cv_vllm063/bin/python -c "$OFFLINE_CPU" ;;
sglang)
  run sglang-launch-server /tmp/cv_sglang/bin/python -m sglang.launch_server --model-path $MODEL --port 8032
  run sglang-launch-server-device-cpu /tmp/cv_sglang/bin/python -m sglang.launch_server --model-path $MODEL \
    --port 8032 --device cpu ;;
mcore)
  TR="/tmp/cv_mcore/bin/torchrun --nproc_per_node 2"
  for mode in train cuda-seed tp-heads; do run mcore-$mode $TR "$HERE/mcore_job.py" $mode; done
  # Megatron-LM's own trainer on mock data, as its examples start it (a GPT of 2 layers): the main branch's
  # tree (/tmp/megatron-lm), then the tree of tag core_v0.16.1 (/tmp/megatron-lm-016), the pip package's release.
  GPT="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
    --micro-batch-size 2 --global-batch-size 4 --train-iters 20 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer
    --vocab-size 128 --log-interval 1 --eval-iters 0 --save /tmp/other-corpus/megatron-ckpt"
  cd /tmp/megatron-lm && run megatron-lm-main-pretrain-gpt $TR pretrain_gpt.py $GPT
  cd /tmp/megatron-lm-016 && run megatron-lm-016-pretrain-gpt $TR pretrain_gpt.py $GPT
  cd /tmp/other-corpus ;;
esac; done
ls -la "$LOGS"
