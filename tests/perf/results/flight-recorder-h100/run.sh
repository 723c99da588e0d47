#!/bin/bash
# A collective job frozen on one GPU (NCCL), judged stalled through a real daemon: does the flight recorder's
# NCCL pipe dump come back into the stacks event, with nvidia-smi -q from real NVML? (issue 54)
set -u
python3 -m venv --system-site-packages /tmp/v >/dev/null && /tmp/v/bin/pip install -q --no-index --no-deps .dev/wheels/*.whl 2>&1 | tail -3
PY=/tmp/v/bin/python
export PYTHONPATH=$PWD SUPERVISE_HOME=/tmp/sh NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf $SUPERVISE_HOME; mkdir -p $SUPERVISE_HOME
cat > /tmp/sh/hang.py <<'PYEOF'
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
t = torch.ones(1 << 20, device="cuda")
for step in range(1, 6):
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"train step {step}/1000 loss=1.0 acc0=0.5 tok/s=100.0", flush=True)
    time.sleep(0.2)
print("frozen after step 5 (as a rank waiting on a peer that never comes)", flush=True)
time.sleep(3600)
PYEOF
cat > /tmp/sh/hang.toml <<TOMLEOF
name = "hang"
command = ["$(command -v python3)", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "/tmp/sh/hang.py"]
probes = ["python", "torch", "train"]
stop_grace_s = 2
[env]
NCCL_NVLS_ENABLE = "0"
TORCH_SYMM_MEM_DISABLE_MULTICAST = "1"
NVSHMEM_DISABLE_NVLS = "1"
[health]
stall_floor_s = 20
[restart]
max_attempts = 1
TOMLEOF
S="$PY -m supervisor.cli"
t0=$(date +%s)
$S start /tmp/sh/hang.toml > $OUT/start.txt 2>&1
for i in $(seq 1 120); do
  st=$($S status hang --json 2>/dev/null | $PY -c "import sys,json; d=json.load(sys.stdin); j=d['jobs'][0] if 'jobs' in d else d; print(j.get('state'))" 2>/dev/null)
  [ "$st" = "failed" ] && break; sleep 2
done
echo "state $st after $(( $(date +%s)-t0 )) s" > $OUT/result.txt
$S events hang > $OUT/events.txt 2>&1
$S events hang --json > $OUT/events.json 2>&1
$S status hang >> $OUT/result.txt 2>&1
$S gpus >> $OUT/result.txt 2>&1
log=$(ls -d /tmp/sh/logs/*/* 2>/dev/null | head -3); echo "$log" >> $OUT/result.txt
find /tmp/sh -name "*.fr" -o -name "rank_*" -o -name "*nvidia-smi*" | head -20 >> $OUT/result.txt
for f in $(find /tmp/sh -name "*.nvidia-smi.txt" | head -1); do head -40 $f > $OUT/smi_head.txt; done
for f in $(find /tmp/sh -name "*.log" | head -2); do tail -30 $f >> $OUT/joblog.txt; done
$S daemon stop >> $OUT/result.txt 2>&1
cat $OUT/result.txt
