#!/usr/bin/env bash
# On the GPU machine: install vLLM 0.23 from the carried pieces, then `vllm serve` a target with an EAGLE-3 draft
# written by `eagle3.speculators_ckpt` (the speculators format: `layers.0.*`, no fc.bias, the verifier recorded),
# given as `--speculative-config '{"method": "eagle3", "model": DRAFT, ...}'`, and measure it with e2e_bench.py
# (vLLM's own /metrics counters), then the target alone for the greedy comparison. vLLM's own log lines
# ("SpecDecoding metrics: ...") are kept with the server log.
#   W=dir-with-target-and-draft OUT=/out bash tests/perf/gpu/exported_draft_serve.sh
# W holds target/ (an e2e_target.py build with bench.jsonl), draft-speculators/ (the exported draft) and
# e2e_bench.py. The vLLM wheels: /tmp/parts/piece.* (one tar of every wheel, split to fit the carry limit; the
# tar holds pk/SHA256SUMS). Knobs: K (3 speculative tokens), LABELS ("draft none"), BENCH_ARGS.
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
W=${W:?W: the folder with target/, draft-speculators/, e2e_bench.py}
OUT=${OUT:-/tmp/exported-out}
K=${K:-3}
mkdir -p "$OUT"
say() { echo "=== $(date +%T) $*"; }

if [ ! -f /tmp/site/.installed ]; then
  say "install vLLM from $(ls /tmp/parts/piece.* | wc -l) pieces"
  mkdir -p /tmp/whl && cat /tmp/parts/piece.* | tar xf - -C /tmp/whl || exit 1
  (cd /tmp/whl && sha256sum --quiet -c pk/SHA256SUMS) || { echo "wheel checksum mismatch"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/whl/*.whl \
    || exit 1
  touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"

server=""
stop_server() { [ -n "$server" ] && kill -TERM -- "-$server" 2>/dev/null; sleep 3; [ -n "$server" ] && \
  kill -KILL -- "-$server" 2>/dev/null; server=""; }
trap stop_server EXIT

serve_one() {  # $1 label, $2 draft dir or empty
  local spec=()
  [ -n "$2" ] && spec=(--speculative-config "{\"method\": \"eagle3\", \"model\": \"$2\", \"num_speculative_tokens\": $K}")
  say "serve $1 ${2:+(draft $2)}"
  local t0=$SECONDS
  setsid python3 -c "from vllm.entrypoints.cli.main import main; main()" serve "$W/target" --port 8011 \
    --gpu-memory-utilization 0.3 --max-model-len 2048 --seed 0 --enforce-eager "${spec[@]}" \
    > "$OUT/serve-$1.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    curl -sf http://127.0.0.1:8011/health >/dev/null && break
    kill -0 "$server" 2>/dev/null || { say "serve $1 died"; tail -40 "$OUT/serve-$1.log"; server=""; return 1; }
    sleep 1
  done
  say "serve $1 ready after $((SECONDS - t0)) s"
  python3 "$W/e2e_bench.py" --port 8011 --prompts "$W/target/bench.jsonl" --label "$1" --out "$OUT" ${BENCH_ARGS:-}
  curl -s http://127.0.0.1:8011/metrics | grep -E '^vllm:spec_decode' > "$OUT/metrics-$1.txt"
  sleep 11  # vLLM logs its SpecDecoding metrics line every 10 s
  stop_server
  grep -E "SpecDecoding metrics|Loading|eagle|Eagle|speculat|Error|error" "$OUT/serve-$1.log" | tail -40
}

for label in ${LABELS:-draft none}; do
  case $label in draft) serve_one draft "$W/draft-speculators" ;; none) serve_one none "" ;; esac
done
say "done"
