#!/usr/bin/env bash
# Diagnose before the kill, on an H200: (1) the board's health read with real NVML (Xid events, ECC,
# pages pending, slowdowns) over 10 samples of a healthy H200: no fault may be reported; (2) `vllm serve`
# (TP=1) of a 13-shard 6.7B model under supervise, its EngineCore frozen (SIGSTOP) at shard 5/13: judged
# stalled, every process of the tree dumped with py-spy before the kill; the dump must name the loading
# code.  Run from the repo root on the GPU machine after the vLLM wheels were copied to /tmp/parts:
#   OUT=/some/dir bash tests/perf/gpu/run_stacks.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
REPO=$(pwd); OUT=${OUT:-/tmp/stacks-out}; mkdir -p "$OUT"
JOBPY=$(command -v python3)
export SUPERVISE_HOME=/tmp/svh-stacks SUPERVISE_GPU_INTERVAL_S=0.5
say() { echo "=== $(date +%T.%N | cut -c1-12) $*"; }
if [ ! -x /tmp/sv/bin/python ]; then
  python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$REPO/.vllm/sv" \
    pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise prometheus-client rich py-spy || exit 1
fi
SV() { PYTHONPATH=$REPO /tmp/sv/bin/python -m supervisor.cli "$@"; }
say "health of the H200 (real NVML)"
PYTHONPATH=$REPO /tmp/sv/bin/python - <<'PY' | tee "$OUT/h200-health.txt"
import time
from supervisor.gpu.nvml import NvmlSampler, new_faults
sampler, previous, faults = NvmlSampler(), None, []
for _ in range(10):
    sample = sampler.sample()
    faults += new_faults(previous, sample)
    previous = sample
    time.sleep(0.5)
for d in sample.devices:
    print(f"GPU {d.index} {d.name}: util {d.util_pct}% used {d.used_mib} MiB; {d.health}")
print("Xid event set:", sampler._xids.note or "registered")
print("faults over 10 samples:", faults)
PY
say "what the box offers beside NVML: nvidia-smi's health fields, the kernel log"
{ nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active --format=csv,noheader 2>&1
  echo "--- /dev/kmsg:"; timeout 2 head -c 600 /dev/kmsg 2>&1 | tr -c '[:print:]\n' '.' ; echo
  echo "--- dmesg:"; timeout 5 dmesg 2>&1 | tail -3
  echo "--- journalctl:"; command -v journalctl || echo "no journalctl"; } > "$OUT/box-health-sources.txt" 2>&1
cat "$OUT/box-health-sources.txt"
bash /tmp/parts/vllm-install.sh >/dev/null 2>&1 || { echo "vllm install failed"; exit 1; }
[ -d /tmp/models/big-llama ] || $JOBPY tests/perf/gpu/big_model.py /tmp/models/big-llama
cat > /tmp/frz.toml <<TOML
name = "frz"
python = "$JOBPY"
command = ["{python}", "-c", "from vllm.entrypoints.cli.main import main; main()", "serve", "/tmp/models/big-llama",
           "--port", "8012", "--enforce-eager", "--max-model-len", "2048", "--gpu-memory-utilization", "0.5",
           "--skip-tokenizer-init"]
probes = ["python", "cuda", "nccl", "vllm", "uvicorn", "tqdm"]
stop_grace_s = 5
[env]
PYTHONPATH = "/tmp/site"
[restart]
max_attempts = 1
[health]
stall_floor_s = 5
TOML
say "start TP=1 (6.7B, 13 shards)"; SV start /tmp/frz.toml
trap '[ -n "${LOG:-}" ] && cp "$LOG" "$OUT/attempt.log"; SV status frz > "$OUT/status.txt" 2>&1' EXIT
LOG=$(SV status frz --json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['attempt']['log_path'])")
FREEZE_PREFIX=EngineCore /tmp/sv/bin/python tests/perf/gpu/freeze_worker.py "$LOG" 5 240 | tee "$OUT/freeze-when.txt"
SV stack frz > "$OUT/stack-on-demand.txt" 2>&1; say "on demand: exit $?"
for i in $(seq 1 240); do
  SV events frz --kind stacks --json 2>/dev/null | grep -q '"kind": *"stacks"' && break; sleep 0.5
done
say "stacks stored"; sleep 8  # the kill
SV status frz > "$OUT/status.txt"
SV events frz --json > "$OUT/events.json"
SV events frz --kind stacks --json > "$OUT/stacks-event.json"
SV attempts frz > "$OUT/attempts.txt"
grep -a -c "" "$LOG"; cp "$LOG" "$OUT/attempt.log"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > "$OUT/nvidia-smi-after.csv"
SV daemon stop
