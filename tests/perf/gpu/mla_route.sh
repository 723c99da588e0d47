#!/usr/bin/env bash
# The EAGLE-3 route for an MLA + MoE target through vLLM 0.23, on one GPU: a random-init DeepSeek-V2 target
# (MLA attention, 8 routed experts + 1 shared, 6 layers, hidden 512, vocabulary 32,000; 59.9M parameters)
# answers random token-id prompts itself (eagle3.regenerate, vLLM, greedy), its hidden states are extracted
# (hf backend on CUDA: vLLM 0.23 cannot capture this family's final layer), the draft is trained (CUDA,
# 8,192-token draft vocabulary), its acceptance estimated on held-out answers (eagle3.heldout), and vLLM then
# serves the target with and without it (tests/perf/eagle3_vllm_acceptance.py: vLLM's own counters, greedy
# outputs compared).  Results of one run: tests/perf/results/mla-route-h200/, RESULTS.md §19.
#
# Here (CPU):  PHASE=build OUT=.gpuwork bash tests/perf/gpu/mla_route.sh   (target, tokenizer, prompt sets)
# There, after vLLM's wheels were installed into /tmp/site (../shared/gpu/README.md) and .gpuwork/tiny-deepseek
# and .gpuwork/g carried into /tmp/w/tiny-deepseek and .gpuwork/g (each carry under the 64 MiB limit):
#              PHASE=run OUT=/dir bash tests/perf/gpu/mla_route.sh     (~3 min on an H200)
#              PHASE=serve OUT=/dir bash tests/perf/gpu/mla_route.sh   (~1 min)
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
REPO=$(pwd) G=${G:-.gpuwork/g} W=${WORK:-/tmp/w2} T=${TARGET:-/tmp/w/tiny-deepseek}
timed() { local s; s=$(date +%s); "$@"; echo "took $(( $(date +%s) - s )) s: ${*:1:3}"; }

case ${PHASE:?PHASE=build, run or serve} in
build)
  mkdir -p "$OUT/g"
  PYTHONPATH=$REPO/jobs python3 - "$OUT" <<'PY'
import json, os, random, sys
import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
from eagle3.tiny_model import build_tokenizer
out = sys.argv[1]
torch.manual_seed(0)
cfg = DeepseekV2Config(hidden_size=512, intermediate_size=1408, moe_intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
    first_k_dense_replace=1, kv_lora_rank=256, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=64,
    v_head_dim=64, vocab_size=32000, max_position_embeddings=4096, topk_method="greedy", n_group=1, topk_group=1,
    torch_dtype="bfloat16")
DeepseekV2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(f"{out}/tiny-deepseek", max_shard_size="40MB")
tok = build_tokenizer(os.path.join(os.environ.get("REPO", "."), "jobs/data/prompts.jsonl"), 32000)
tok.save_pretrained(f"{out}/tiny-deepseek")
r = random.Random(0)
for name, n in (("train_prompts", 2000), ("heldout_prompts", 128)):
    with open(f"{out}/g/{name}.jsonl", "w") as f:
        for _ in range(n):
            f.write(json.dumps({"token_ids": [r.randrange(5, 1085) for _ in range(16)]}) + "\n")
PY
  ;;
run)
  export PYTHONPATH=/tmp/site:$REPO/jobs
  mkdir -p "$W" "$OUT"
  timed python3 -m eagle3.regenerate --model $T --prompts $G/train_prompts.jsonl --out $W/train.jsonl --backend vllm \
    --max-new-tokens 128 > $OUT/regen-train.log 2>&1
  timed python3 -m eagle3.regenerate --model $T --prompts $G/heldout_prompts.jsonl --out $W/heldout.jsonl --backend vllm \
    --max-new-tokens 128 > $OUT/regen-heldout.log 2>&1
  for set in train heldout; do
    timed python3 -m eagle3.extract --model $T --prompts $W/$set.jsonl --out $W/ext-$set --backend hf --device cuda \
      --dtype bfloat16 --layer-ids 1,3,4,6 --max-seq-len 160 --batch-size 32 > $OUT/extract-$set.log 2>&1
  done
  timed python3 -m eagle3.train --data $W/ext-train --out $W/draft --device cuda --epochs 8 --batch-size 32 \
    --draft-vocab 8192 --log-every 50 > $OUT/train.log 2>&1
  timed python3 -m eagle3.heldout --draft $W/draft --data $W/ext-heldout --target-model $T --steps 3 --device cuda \
    > $OUT/heldout.log 2>&1
  tail -1 $OUT/heldout.log
  ;;
serve)
  PYTHONPATH=/tmp/site:$REPO/jobs python3 tests/perf/eagle3_vllm_acceptance.py $T $W/ext-heldout $W/draft \
    --prompts 64 --prompt-len 16 --max-tokens 64 > $OUT/acceptance.log 2>&1
  grep "^EAGLE3" $OUT/acceptance.log
  ;;
esac
