"""A real daemon process on a machine without a GPU: the daemon as `python -m supervisor.daemon.process`
runs it, except that NVML is `FileNvml`, a FakeNvml whose processes are declared by files.

A job process declares GPU memory by writing `<holders>/<pid>` with lines `GPU MIB` (rewrite
it to change the amount).  The fake lists the process on those devices while it lives, and
frees its memory a moment after it dies, as the driver does.  A third column `GPU MIB STUCK_S`
keeps the process listed, memory held, for STUCK_S seconds after it died: a process stuck in
the driver's teardown, as nvidia-smi shows one.  The holders directory is
`$SUPERVISE_FAKE_GPU_HOLDERS`; the number of devices `$SUPERVISE_FAKE_GPUS` (default 2).
`SUPERVISE_FAKE_GPU_XID_EVENTS=0` refuses NVML's event set, as a container does: Xids are then
read from the kernel log (`SUPERVISE_KERNEL_LOG`).

    python tests/fakes/gpu_daemon.py      # with SUPERVISE_HOME and the two variables set
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes.fake_nvml import FakeNvml
from supervisor.core.config import default_paths, load_settings
from supervisor.daemon.process import Daemon, configure_logging

FREE_LAG_S = 0.3


class FileNvml(FakeNvml):
    def __init__(self, holders: Path, devices: int) -> None:
        super().__init__(clock=time.monotonic)
        self.holders = holders
        for _ in range(devices):
            self.add_device(total_mib=81559, name="NVIDIA H100 80GB HBM3 (fake)")
        self._died: set[int] = set()

    def _sync(self) -> None:
        for path in self.holders.iterdir():
            if not path.name.isdigit():
                continue
            pid = int(path.name)
            if pid in self._died:
                continue
            try:
                wanted = [tuple(int(x) for x in line.split()) for line in path.read_text().splitlines() if line.strip()]
            except (OSError, ValueError):
                continue
            if not _alive(pid):
                self._died.add(pid)
                stuck_s = max((float(line[2]) for line in wanted if len(line) > 2), default=0.0)
                self.exit_process(pid, after_s=stuck_s, free_lag_s=FREE_LAG_S)
                continue
            mine = {p.gpu: p for p in self.processes if p.pid == pid}
            for gpu, mib, *_ in wanted:
                if gpu in mine:
                    mine[gpu].mib = mib
                elif gpu < len(self.devices):
                    self.start_process(pid, gpu=gpu, mib=mib)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._sync()
        return super().nvmlDeviceGetMemoryInfo(handle, version)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._sync()
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def main() -> None:
    configure_logging()
    paths = default_paths()
    loaded = load_settings(paths)
    holders = Path(os.environ["SUPERVISE_FAKE_GPU_HOLDERS"])
    holders.mkdir(parents=True, exist_ok=True)
    nvml = FileNvml(holders, int(os.environ.get("SUPERVISE_FAKE_GPUS", "2")))
    nvml.events_supported = os.environ.get("SUPERVISE_FAKE_GPU_XID_EVENTS", "1") != "0"
    daemon = Daemon(paths, loaded.settings, nvml=nvml, loaded=loaded)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.request_stop)
    await daemon.serve()


if __name__ == "__main__":
    asyncio.run(main())
