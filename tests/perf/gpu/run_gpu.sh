#!/usr/bin/env bash
# The whole loop on a real GPU (NVIDIA H200, vLLM 0.23.0, real NVML). Run from the repo root on the GPU
# machine, after the vLLM wheels were copied to /tmp/parts (see docs/results/index.md, "Proof on a GPU").
#   OUT=/some/dir bash tests/perf/gpu/run_gpu.sh
# supervise runs in its own venv (no system site packages: vLLM installs supervisord's `supervisor`);
# jobs run under the machine's torch python with vLLM on PYTHONPATH.
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
JOBPY=$(command -v python3)
WHEELS=${WHEELS:-$REPO/.vllm/sv}
export SUPERVISE_HOME=/tmp/svh SUPERVISE_GPU_INTERVAL_S=0.25 SUPERVISE_GPU_STORE_EVERY_S=0.25
say() { echo "=== $(date +%T) $*"; }

say "supervise venv"
python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$WHEELS" \
  pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise prometheus-client rich || exit 1
SV() { PYTHONPATH=$REPO /tmp/sv/bin/python -m supervisor.cli "$@"; }

say "vLLM"
bash "$REPO/.vllm/part6/vllm-install.sh" || echo "vLLM install failed"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > "$OUT/nvidia-smi-before.csv"

say "tiny model"
(cd jobs && $JOBPY -m eagle3.tiny_model /tmp/models/tiny-llama) 2>&1 | tail -3

say "A: extract with the vllm backend, verified against hf"
SV start extract --set backend=vllm --set device=cuda --python "$JOBPY" --set pythonpath=/tmp/site \
   --set model=/tmp/models/tiny-llama --set out=/tmp/out-vllm --set verify=8 --follow 2>&1 | grep -v "progress extract" | tail -25
cp "$SUPERVISE_HOME/logs/extract/attempt-1.log" "$OUT/extract-vllm.log" 2>/dev/null
python3 - <<'PY' 2>&1 | tee "$OUT/extract-verify.txt"
import json; m = json.load(open("/tmp/out-vllm/manifest.json")); print(json.dumps(m.get("verify"), indent=1)[:3000])
PY

cat > /tmp/hog.toml <<TOML
name = "hog"
python = "$JOBPY"
command = ["{python}", "$REPO/tests/perf/gpu/gpu_hog.py", "8", "--orphan", "6"]
probes = ["python", "cuda"]
stop_grace_s = 3
[restart]
max_attempts = 3
backoff_initial_s = 1
backoff_jitter_s = 0
[gpu]
release_timeout_s = 60
release_tolerance_mib = 512
TOML
say "B: crash with an orphaned GPU worker, clean-up, relaunch, same bug twice stops"
SV start /tmp/hog.toml --follow 2>&1 | tail -25
SV attempts hog

cat > /tmp/serve.toml <<TOML
name = "serve"
python = "$JOBPY"
command = ["{python}", "-c", "from vllm.entrypoints.cli.main import main; main()", "serve", "/tmp/models/tiny-llama", "--port", "8011",
           "--gpu-memory-utilization", "0.3", "--enforce-eager", "--max-model-len", "2048"]
probes = ["python", "cuda", "nccl", "vllm", "uvicorn", "tqdm"]
stop_grace_s = 10
[env]
PYTHONPATH = "/tmp/site"
[restart]
max_attempts = 2
backoff_initial_s = 1
backoff_jitter_s = 0
[gpu]
release_timeout_s = 90
TOML
say "C: vllm serve under supervise; SIGKILL of its API server orphans the EngineCore"
SV start /tmp/serve.toml
for i in $(seq 1 240); do SV events serve --json 2>/dev/null | grep -q "Application startup complete" && break; sleep 1; done
say "ready; API server pid:"
API=$(SV status serve --json | python3 -c "import json,sys; a=json.load(sys.stdin)['jobs'][0]['attempt']; print(a['pid'])")
CHILD=$(pgrep -P "$API" | head -1)
ps -o pid,ppid,pgid,cmd -g "$API" | cut -c1-150 | tee "$OUT/serve-tree-before.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee -a "$OUT/serve-tree-before.txt"
say "kill -9 $CHILD (the API server)"; kill -9 "$CHILD"
for i in $(seq 1 240); do
  n=$(SV events serve --json 2>/dev/null | grep -c "Application startup complete"); [ "$n" -ge 2 ] && break; sleep 1
done
say "relaunched and ready again ($n ready events)"
SV stop serve
SV attempts serve
SV events serve | grep -E "launched|exited|verdict|action|phase" | cut -c1-220 | tee "$OUT/serve-events.txt"

say "collect"
SV events hog --json > "$OUT/hog-events.jsonl"
SV events serve --json > "$OUT/serve-events.jsonl"
SV events extract --json | grep -v '"progress"' > "$OUT/extract-events.jsonl"
cp "$SUPERVISE_HOME/supervise.db" "$OUT/supervise.db"
PYTHONPATH=$REPO /tmp/sv/bin/python tests/perf/gpu/analyse_gpu.py "$SUPERVISE_HOME/supervise.db" | tee "$OUT/analysis.md"
tar czf "$OUT/logs.tgz" -C "$SUPERVISE_HOME" logs daemon.log 2>/dev/null
ls -la "$OUT"
