#!/usr/bin/env bash
# EAGLE-3 on a trained MLA + MoE target with a real 32,000-token tokenizer, one GPU. The text is natural English
# found on the machine itself (docstring_corpus.py: the docstrings of the standard library, transformers, torch
# and numpy, as conversations with a thinking section); e2e_target.py trains the byte-level BPE tokenizer
# (32,000) and the DeepSeek-V2 on it (--text docstrings). Drafts on conversations from files the target never
# saw: "docs" on the docstrings' own answers, "regen" on the target's answers through the chat template with
# thinking on (eagle3.regenerate), each with a draft vocabulary of k of 32,000 tokens; estimated on held-out
# conversations (eagle3.heldout, both the documents and the target's regenerated answers) and served by
# `vllm serve` without and with each draft, measured by e2e_bench.py (tokens/s and vLLM's counters).
# Run from the repo root on the GPU machine after vLLM's wheels were installed into /tmp/site
# (../shared/gpu/README.md), phases in as many calls as fit (each under 10 min on an H200):
#   PHASES="target"          OUT=/dir bash tests/perf/gpu/mla_real_vocab.sh   (corpus, tokenizer, target, prompts)
#   PHASES="extract regen"   OUT=/dir bash tests/perf/gpu/mla_real_vocab.sh   (hidden states; regenerated answers)
#   PHASES="drafts"          OUT=/dir bash tests/perf/gpu/mla_real_vocab.sh   (drafts and their held-out estimates)
#   PHASES="serve table"     OUT=/dir bash tests/perf/gpu/mla_real_vocab.sh   (vllm serve + e2e_bench, the table)
#   PHASES="svreport"        OUT=/dir bash tests/perf/gpu/mla_real_vocab.sh   (SUPERVISED: events, reports, store)
# Two work calls on a fresh machine after the wheels (about 16-17 min of device time in all, RESULTS §21):
#   SUPERVISED=1 PHASES="target extract regen drafts svreport"   then   PHASES="serve table"
# Knobs: TARGET_STEPS (1000), DRAFTS ("docs:8192 regen:8192 docs:16384 docs:32000"), SERVE_LABELS ("none
# docs-8192 regen-8192 docs-16384 docs-32000"), TABLE_LABELS (SERVE_LABELS), EPOCHS (6), REGEN_TOKENS (256),
# DEVICE (cuda), REGEN_BACKEND (vllm), K (3 speculative tokens), BENCH_ARGS (e2e_bench.py options), HELDOUT
# (0: no held-out extractions, so no held-out estimates).
# SUPERVISED=1: the extractions, the regeneration and the drafts' training run as supervise jobs (a spec written
# per step, `supervise start --follow`), the daemon watching them and storing their events in
# $SUPERVISE_HOME/supervise.db; supervise runs on the machine's python3 with its own dependencies in SVSITE
# (/tmp/svsite: the wheels the machine lacks — structlog tenacity asyncssh cryptography cffi pycparser google-re2
# apprise requests-oauthlib oauthlib py-spy, fetched elsewhere with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 ...`, and pydantic, pydantic-core, annotated-types and
# typing-inspection from vLLM's parts — installed with `pip install --no-index --no-deps --target /tmp/svsite
# WHEELS`), the repo first on its path, since
# vLLM's site holds supervisord's package of the same name `supervisor`. Phase svreport writes each job's
# `supervise events`, `supervise report` (html) and attempts, the accounting and a copy of the store under
# $OUT/sv, then stops the daemon, so that the serving measurements run without it.
# Each phase's duration goes to $OUT/durations.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=true
REPO=$(pwd) W=${WORK:-/tmp/mlavocab}
T=$W/target OUT=${OUT:-/tmp/mlavocab-out}
export PYTHONPATH=${SITE:-/tmp/site}:$REPO/jobs
DEVICE=${DEVICE:-cuda} K=${K:-3} EPOCHS=${EPOCHS:-6}
LAYERS=1,3,4,6
mkdir -p "$OUT" "$W"
export SUPERVISE_HOME=${SUPERVISE_HOME:-$W/svh} SUPERVISE_GPU_INTERVAL_S=${SUPERVISE_GPU_INTERVAL_S:-0.5}
SVSITE=${SVSITE:-/tmp/svsite}
SV() { PYTHONPATH=$REPO:$SVSITE PATH=$SVSITE/bin:$PATH python3 -m supervisor.cli "$@"; }
# A server must not outlive the script (a timeout's TERM included): the next one would find its port taken and
# its bench would measure the old server.
SERVER=""
trap '[ -n "$SERVER" ] && kill -KILL -- -"$SERVER" 2>/dev/null' EXIT
trap 'exit 143' TERM INT
say() { echo "=== $(date +%T) $*"; }
timed() { local s; s=$(date +%s); "$@"; echo "took $(( $(date +%s) - s )) s: ${*:1:4}"; }

# step NAME LOG PROBES CMD...: one pipeline step, its output into LOG. Without SUPERVISED, run here; with it, as
# the supervise job NAME (a spec written for it, started with --follow, which returns when the job ends), LOG
# then being its attempts' logs as supervise kept them.
step() {
  local name=$1 log=$2 probes=$3; shift 3
  if [ -z "${SUPERVISED:-}" ]; then timed "$@" > "$log" 2>&1; return; fi
  mkdir -p "$OUT/sv"
  python3 - "$W/$name.toml" "$name" "$probes" "$REPO" "$PYTHONPATH" "$@" <<'PY'
import json, sys
path, name, probes, repo, pythonpath, *argv = sys.argv[1:]
q = json.dumps  # a JSON string is a TOML basic string
argv = [a.replace("{", "{{").replace("}", "}}") for a in argv]  # literal braces, not supervise's templates
spec = [f"name = {q(name)}", f"workdir = {q(repo)}", f"command = {q(argv)}", f"probes = {q(probes.split(','))}",
        "stop_grace_s = 20", "[env]", f"PYTHONPATH = {q(pythonpath)}", 'TOKENIZERS_PARALLELISM = "true"',
        "[restart]", "max_attempts = 2", "backoff_initial_s = 5", "[health]", "stall_floor_s = 120",
        "silence_s = 600"]
open(path, "w").write("\n".join(spec) + "\n")
PY
  local s; s=$(date +%s)
  SV start "$W/$name.toml" --follow > "$OUT/sv/$name.follow.log" 2>&1
  local rc=$?
  echo "took $(( $(date +%s) - s )) s: supervise job $name (start --follow exit $rc)"
  cat "$SUPERVISE_HOME/logs/$name"/attempt-*.log > "$log" 2>/dev/null
}

phase_target() {
  say "target: docstring corpus, tokenizer, training, prompt sets"
  timed python3 tests/perf/gpu/e2e_target.py build "$T" --size mla --text docstrings --steps "${TARGET_STEPS:-1000}" \
    ${TARGET_ARGS:-} 2>&1 | grep -v "Writing model shards" > "$OUT/target-build.log"
  grep -E "source|docstrings:|corpus|model:|held_out|saved|took" "$OUT/target-build.log" | tail -12
  python3 tests/perf/gpu/e2e_target.py prompts "$T" --extract "${EXTRACT_N:-3000}" --bench 64 | tee -a "$OUT/target-build.log"
  cp "$T/e2e_target.json" "$T/config.json" "$T/coverage.json" "$OUT/"
}

extract() {  # $1 prompt set, $2 output name
  step "extract-$2" "$OUT/extract-$2.log" python,cuda,transformers,tqdm,extract python3 -m eagle3.extract --model "$T" --prompts "$1" --out "$W/ext-$2" --backend hf --device "$DEVICE" \
    --dtype bfloat16 --layer-ids $LAYERS --max-seq-len 512 --batch-size 32
  tail -2 "$OUT/extract-$2.log"
}

phase_extract() {
  say "extract: hidden states of the draft and held-out conversations (hf backend)"
  extract "$T/draft_docs.jsonl" docs
  [ "${HELDOUT:-1}" = 0 ] || extract "$T/heldout_docs.jsonl" heldout-docs
}

phase_regen() {
  say "regenerate: the target answers the user turns through its chat template, thinking on"
  cat "$T/draft_asks.jsonl" "$T/heldout_asks.jsonl" > "$W/asks.jsonl"
  step regenerate "$OUT/regen.log" python,cuda,transformers,vllm python3 -m eagle3.regenerate --model "$T" \
    --prompts "$W/asks.jsonl" --out "$W/regen-all.jsonl" --backend "${REGEN_BACKEND:-vllm}" --device "$DEVICE" \
    --max-new-tokens "${REGEN_TOKENS:-256}"
  grep -E "^regenerate|took" "$OUT/regen.log"
  local n; n=$(wc -l < "$T/heldout_asks.jsonl")
  head -n -"$n" "$W/regen-all.jsonl" > "$W/regen.jsonl"
  tail -n "$n" "$W/regen-all.jsonl" > "$W/heldout-regen.jsonl"
  # Three regenerated answers, decoded, as a sample of what the target writes.
  python3 - "$T" "$W/heldout-regen.jsonl" > "$OUT/regen-samples.txt" <<'PY'
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
for line in open(sys.argv[2]).readlines()[:3]:
    print(tok.decode(json.loads(line)["token_ids"]) + "\n" + "-" * 60)
PY
  extract "$W/regen.jsonl" regen
  [ "${HELDOUT:-1}" = 0 ] || extract "$W/heldout-regen.jsonl" heldout-regen
}

phase_drafts() {
  for d in ${DRAFTS:-docs:8192 regen:8192 docs:16384 docs:32000}; do
    local data=${d%%:*} k=${d##*:} name="${d%%:*}-${d##*:}"
    say "draft $name: trained on ext-$data, draft vocabulary $k"
    step "train-$name" "$OUT/train-$name.log" python,cuda,train python3 -m eagle3.train --data "$W/ext-$data" \
      --out "$W/draft-$name" --device "$DEVICE" --epochs "$EPOCHS" --batch-size 32 --draft-vocab "$k" --log-every 100
    grep -E "train config|note|step .*/" "$OUT/train-$name.log" | tail -3
    for h in heldout-docs heldout-regen; do
      [ -d "$W/ext-$h" ] || continue
      timed python3 -m eagle3.heldout --draft "$W/draft-$name" --data "$W/ext-$h" --target-model "$T" --steps "$K" \
        --device "$DEVICE" > "$OUT/heldout-$name-on-$h.log" 2>&1
      tail -2 "$OUT/heldout-$name-on-$h.log"
    done
  done
}

serve_one() {  # $1 label, $2 draft dir or empty
  local spec=()
  [ -n "$2" ] && spec=(--speculative-config "{\"method\": \"eagle3\", \"model\": \"$2\", \"num_speculative_tokens\": $K}")
  say "serve $1 ${2:+(draft $2)}"
  # The GPU must be free: a leftover server would share it and spoil the tok/s (as it once did).
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$OUT/serve-$1.gpu-before.txt"
  [ -s "$OUT/serve-$1.gpu-before.txt" ] && { echo "GPU NOT FREE before serve $1:"; cat "$OUT/serve-$1.gpu-before.txt"; }
  setsid python3 -c "from vllm.entrypoints.cli.main import main; main()" serve "$T" --port 8011 \
    --gpu-memory-utilization 0.3 --max-model-len 2048 --seed 0 "${spec[@]}" > "$OUT/serve-$1.log" 2>&1 &
  local pid=$! ok=""
  SERVER=$pid
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8011/health >/dev/null && { ok=1; break; }; sleep 1; done
  say "serve $1 ${ok:+ready}${ok:-NOT READY}"
  [ -n "$ok" ] && python3 tests/perf/gpu/e2e_bench.py --port 8011 --prompts "$T/bench.jsonl" --label "$1" \
    --out "$OUT/bench" ${BENCH_ARGS:-}
  kill -TERM -- -"$pid" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- -"$pid" 2>/dev/null
  SERVER=""
  # The server's log without its per-request lines.
  grep -vE "POST /v1/completions|GET /metrics|GET /health" "$OUT/serve-$1.log" | tail -60 > "$OUT/serve-$1.tail.log"
  rm -f "$OUT/serve-$1.log"
}

phase_serve() {
  for label in ${SERVE_LABELS:-none docs-8192 regen-8192 docs-16384 docs-32000}; do
    if [ "$label" = none ]; then serve_one none ""; else serve_one "$label" "$W/draft-$label"; fi
  done
}

phase_svreport() {  # the supervised steps as the daemon stored them; then the daemon stops
  say "supervise: events, reports, accounting, the store"
  mkdir -p "$OUT/sv"
  local jobs; jobs=$(SV jobs 2>/dev/null | awk '{print $1}')
  SV jobs > "$OUT/sv/jobs.txt" 2>&1
  for j in $jobs; do
    SV events "$j" > "$OUT/sv/$j.events.txt" 2>&1
    SV events "$j" --json > "$OUT/sv/$j.events.jsonl" 2>&1
    SV attempts "$j" > "$OUT/sv/$j.attempts.txt" 2>&1
    SV report "$j" --out "$OUT/sv/$j.report.html" > /dev/null 2>&1
  done
  SV accounting > "$OUT/sv/accounting.txt" 2>&1
  cat "$OUT/sv/jobs.txt" "$OUT/sv/accounting.txt"
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$SUPERVISE_HOME/supervise.db" "$OUT/sv/supervise.db"
  cp "$SUPERVISE_HOME/daemon.log" "$OUT/sv/" 2>/dev/null
  SV daemon stop
}

phase_table() {
  python3 tests/perf/gpu/e2e_table.py "$OUT" ${TABLE_LABELS:-${SERVE_LABELS:-none docs-8192 regen-8192 docs-16384 docs-32000}} \
    | tee "$OUT/e2e.md"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.csv" 2>/dev/null
for p in ${PHASES:?PHASES=target extract regen drafts svreport serve table}; do
  t0=$(date +%s); "phase_$p"; echo "phase $p: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/durations.txt"
done
say "done: $PHASES"
