#!/usr/bin/env bash
# EAGLE-3 on a *trained* MLA + MoE target, one GPU: e2e_target.py trains a DeepSeek-V2 (MLA, 8 routed experts,
# vocabulary 32,000) on its synthetic corpus; then two drafts — one on the held-apart documents, one on the
# target's own greedy answers to their openings (eagle3.regenerate) — each extracted by the hf backend (vLLM 0.23
# cannot capture this family's last layer), trained, estimated on held-out documents (eagle3.heldout), and
# served by vLLM 0.23 beside the target alone (tests/perf/eagle3_vllm_acceptance.py: vLLM's counters, greedy
# outputs compared).  After vLLM's wheels were installed into /tmp/site (../shared/gpu/README.md):
#   PHASE=target OUT=/dir bash tests/perf/gpu/mla_trained.sh    (build + train the target, the prompt sets)
#   PHASE=drafts OUT=/dir bash tests/perf/gpu/mla_trained.sh    (both drafts, their estimates, serving)
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
REPO=$(pwd) W=${WORK:-/tmp/mla} T=${WORK:-/tmp/mla}/target
export PYTHONPATH=/tmp/site:$REPO/jobs
timed() { local s; s=$(date +%s); "$@"; echo "took $(( $(date +%s) - s )) s: ${*:1:4}"; }
mkdir -p "$OUT" "$W"
case ${PHASE:?PHASE=target or drafts} in
target)
  timed python3 tests/perf/gpu/e2e_target.py build $T --size mla --steps ${TARGET_STEPS:-1200} 2>&1 \
    | grep -v "Writing model shards" > $OUT/target-build.log
  grep -E "corpus|model:|step [0-9]*00/|saved|took" $OUT/target-build.log | tail -8
  python3 tests/perf/gpu/e2e_target.py prompts $T --extract ${EXTRACT_N:-3000} --bench 64 | tee -a $OUT/target-build.log
  head -n -200 $T/extract.jsonl > $W/train_docs.jsonl
  tail -n 200 $T/extract.jsonl > $W/heldout_docs.jsonl
  # The openings of the training documents, as token ids (no chat template: the target learnt raw text).
  python3 - "$T" "$W" <<'PY'
import json, sys
sys.path.insert(0, "tests/perf/gpu")
from e2e_target import opening
from transformers import AutoTokenizer
t, w = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(t)
with open(f"{w}/train_docs.jsonl") as src, open(f"{w}/openings.jsonl", "w") as out:
    for line in src:
        ids = tok(opening(json.loads(line)["prompt"]), add_special_tokens=True)["input_ids"]
        out.write(json.dumps({"token_ids": ids}) + "\n")
PY
  cp $T/e2e_target.json $T/config.json $OUT/
  ;;
drafts)
  for set in train_docs heldout_docs; do
    timed python3 -m eagle3.extract --model $T --prompts $W/$set.jsonl --out $W/ext-$set --backend hf --device cuda \
      --dtype bfloat16 --layer-ids 1,3,4,6 --max-seq-len 512 --batch-size 32 > $OUT/extract-$set.log 2>&1
    tail -1 $OUT/extract-$set.log
  done
  timed python3 -m eagle3.regenerate --model $T --prompts $W/openings.jsonl --out $W/regen.jsonl --backend vllm \
    --max-new-tokens 256 > $OUT/regen.log 2>&1
  grep "^regenerate:" $OUT/regen.log
  timed python3 -m eagle3.extract --model $T --prompts $W/regen.jsonl --out $W/ext-regen --backend hf --device cuda \
    --dtype bfloat16 --layer-ids 1,3,4,6 --max-seq-len 512 --batch-size 32 > $OUT/extract-regen.log 2>&1
  tail -1 $OUT/extract-regen.log
  for d in train_docs regen; do
    timed python3 -m eagle3.train --data $W/ext-$d --out $W/draft-$d --device cuda --epochs ${EPOCHS:-6} --batch-size 32 \
      --draft-vocab 8192 --log-every 100 > $OUT/train-$d.log 2>&1
    grep -E "note|step .*/" $OUT/train-$d.log | tail -2
    timed python3 -m eagle3.heldout --draft $W/draft-$d --data $W/ext-heldout_docs --target-model $T --steps 3 \
      --device cuda > $OUT/heldout-$d.log 2>&1
    tail -1 $OUT/heldout-$d.log
  done
  timed python3 tests/perf/eagle3_vllm_acceptance.py $T $W/ext-heldout_docs $W/draft-train_docs $W/draft-regen \
    --prompts 64 --prompt-len 24 --max-tokens 128 > $OUT/acceptance.log 2>&1
  grep "^EAGLE3" $OUT/acceptance.log
  ;;
esac
