#!/usr/bin/env bash
# GPU faults beside NVML's event set, on an H200: (1) the kernel-log path — NVML with its event set
# refused (as in a container) and /dev/kmsg read; an Xid-format record written to /dev/kmsg (this
# machine is lent bare and given back: the record says it is a test) must come back on the GPU at its
# PCI address; (2) what an SSH box gives — the GPUS script run by /bin/sh here against the real
# nvidia-smi and dmesg, parsed as the SSH host parses it: no fault on the healthy board over 5
# samples, then the written Xid line.  Run from the repo root:  OUT=DIR bash tests/perf/gpu/run_xids.sh
set -uo pipefail
REPO=$(pwd); OUT=${OUT:-/tmp/xids-out}; mkdir -p "$OUT"
if [ ! -x /tmp/sv/bin/python ]; then
  python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$REPO/.vllm/sv" \
    pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise prometheus-client rich py-spy || exit 1
fi
PYTHONPATH=$REPO /tmp/sv/bin/python - <<'PY' 2>&1 | tee "$OUT/xids-h200.txt"
import subprocess, time
import pynvml
from supervisor.gpu.nvml import NvmlSampler, new_faults
from supervisor.hosts import _remote, _remote_parse
from supervisor.gpu.kernel_xids import KmsgReader, XidCursor


class EventsRefused:
    """The real pynvml, but its event set refused (NVML_ERROR_NOT_SUPPORTED), as in a container."""
    def __getattr__(self, name):
        return getattr(pynvml, name)

    def nvmlEventSetCreate(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def kernel_form(bus_id: str) -> str:
    domain, bus, rest = bus_id.split(":")
    return f"{domain[-4:]}:{bus.lower()}:{rest.split('.')[0].lower()}"


def remote_sample(cursor):
    out = subprocess.run(["/bin/sh", "-c", _remote.GPUS, "sh", "nvidia-smi", "dmesg"], capture_output=True, text=True)
    return _remote_parse.gpu_sample(time.time(), out.returncode, out.stdout.splitlines(), out.stderr, "this box", cursor)


sampler = NvmlSampler(nvml=EventsRefused(), kernel_log=KmsgReader())
cursor = XidCursor()
first, r_first = sampler.sample(), remote_sample(cursor)
print("NVML:", [(d.index, d.name, d.pci_bus_id, d.health) for d in first.devices])
print("xid source:", sampler.xid_source())
print("nvidia-smi as an SSH box gives it:", [(d.index, d.pci_bus_id, d.health) for d in r_first.devices])
quiet_nvml, quiet_remote, prev, r_prev = [], [], first, r_first
for _ in range(5):
    time.sleep(0.5)
    now, r_now = sampler.sample(), remote_sample(cursor)
    quiet_nvml += new_faults(prev, now)
    quiet_remote += new_faults(r_prev, r_now)
    prev, r_prev = now, r_now
print("faults over 5 healthy samples: NVML + kernel log", quiet_nvml, "| nvidia-smi + dmesg", quiet_remote)
line = (f"NVRM: Xid (PCI:{kernel_form(first.devices[0].pci_bus_id)}): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus. (written by supervise's GPU test run, not a real fault)")
with open("/dev/kmsg", "w") as kmsg:
    kmsg.write(line + "\n")
print("written to /dev/kmsg:", line)
time.sleep(0.2)
after, r_after = sampler.sample(), remote_sample(cursor)
print("faults seen, kernel log path:", [f.describe() for f in new_faults(prev, after)])
print("faults seen, SSH path (nvidia-smi + dmesg):", [f.describe() for f in new_faults(r_prev, r_after)])
print("and once only:", new_faults(after, sampler.sample()), new_faults(r_after, remote_sample(cursor)))
sampler.close()
PY
