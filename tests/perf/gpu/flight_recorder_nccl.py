"""The flight recorder's NCCL path on a GPU machine: a real torchrun job on NCCL, hung in a
collective, its dumps asked for through the per-attempt pipe exactly as the daemon asks
(``flight_recorder.environment`` at launch, ``flight_recorder.collect`` at the verdict), then
``nvidia-smi -q`` taken as at the verdict (``smi_report.take``).  Prints the summary line and how
long each took beside the bound it runs within.

    OUT=/some/dir python3 tests/perf/gpu/flight_recorder_nccl.py

One rank per GPU.  With two GPUs or more, the last rank stops before collective #4 that the others
enter (a rank behind).  With one GPU (NCCL refuses two ranks on one device), rank 0 enqueues #4
behind a long sleep kernel on its stream: the collective is scheduled and never starts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from supervisor.gpu import smi_report
from supervisor.hosts import flight_recorder

JOB = """
import os, time, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
t = torch.ones(1 << 20, device="cuda")
for step in range(1, 4):
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {rank} step {step} done", flush=True)
if world > 1 and rank == world - 1:
    print(f"rank {rank} stops before #4", flush=True)
    time.sleep(3600)
if world == 1:
    torch.cuda._sleep(1 << 40)  # the stream is busy far longer than the run: #4 stays scheduled
dist.all_reduce(t)
print(f"rank {rank} entered #4", flush=True)
torch.cuda.synchronize()
"""


def main() -> int:
    import torch

    out = Path(os.environ.get("OUT", "/tmp/fr-out"))
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {gpus} GPU(s): "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="fr-"))
    script = work / "job.py"
    script.write_text(JOB)
    folder = flight_recorder.folder_for(str(work / "attempt-1.log"))
    folder.mkdir()
    env = {**os.environ, **flight_recorder.environment(folder, {})}
    log = open(work / "attempt-1.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             str(gpus), str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        want = gpus - 1 if gpus > 1 else 1
        deadline = time.monotonic() + 240
        while (work / "attempt-1.log").read_text(errors="replace").count("entered #4") < want:
            if time.monotonic() > deadline or proc.poll() is not None:
                print("the job never hung:\n" + (work / "attempt-1.log").read_text(errors="replace")[-3000:])
                return 1
            time.sleep(0.2)
        time.sleep(2)  # in the collective
        pipes = sorted(p.name for p in folder.glob("*.pipe"))
        print(f"pipes opened by the ranks: {pipes}", flush=True)
        for n in (1, 2):
            for old in folder.glob("rank_[0-9]*"):
                if not old.name.endswith(".pipe"):
                    old.unlink()
            began = time.monotonic()
            record = asyncio.run(flight_recorder.collect(folder))
            took = time.monotonic() - began
            print(f"collect #{n}: {took:.2f} s (bound {flight_recorder.WAIT_S:.0f} s): "
                  f"{record.summary if record else None}", flush=True)
        if record is not None:
            for dump in record.dumps:
                shutil.copy(dump, out / f"nccl-{Path(dump).name}.pickle")
        began = time.monotonic()
        said = asyncio.run(smi_report.take(out / "nvidia-smi-q.txt"))
        print(f"nvidia-smi -q: {time.monotonic() - began:.2f} s (bound {smi_report.TIMEOUT_S:.0f} s): {said}")
        shutil.copy(work / "attempt-1.log", out / "job.log")
        return 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
