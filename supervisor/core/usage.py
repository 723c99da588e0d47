"""What an attempt used: CPU seconds, peak memory and tasks from its cgroup (read as it ends, before
the cgroup goes), and GPU memory and GPU-seconds from the GPU samples of its processes.  Stored with
the attempt, shown by `attempts`, `status`, `accounting` and the web page, counted in the metrics.

Each figure is None where the host cannot tell: cgroup figures need the attempt's own cgroup (a
local host with cgroup v2; memory.peak needs the memory controller and Linux 5.19, pids.peak the
pids controller and Linux 6.1); GPU figures come from samples, so a process that held a GPU for
less than a sample interval may be missed, and what ran while no daemon watched is not counted.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_MAX_GAP_S = 60.0  # a gap between two samples longer than this (a daemon restart) counts as this


class AttemptUsage(BaseModel):
    model_config = ConfigDict(frozen=True)

    cpu_s: float | None = Field(default=None, description="CPU seconds (user + system) of the attempt's cgroup")
    peak_memory_mib: int | None = Field(default=None, description="the most memory its cgroup held at once")
    peak_memory_sampled: bool = Field(default=False, description="peak_memory_mib was sampled (its processes' "
                                                                 "resident memory each second): the cgroup did not count it")
    peak_tasks: int | None = Field(default=None, description="the most tasks (processes and threads) at once")
    gpu_peak_mib: dict[int, int] = Field(default_factory=dict,
                                         description="per GPU index, the most memory its processes held (sampled)")
    gpu_s: float | None = Field(default=None, description="GPU-seconds: GPUs its processes held x time (sampled); "
                                                         "null where its host's GPUs could not be read")

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpu_s is None else self.gpu_s / 3600

    def with_host(self, host: AttemptUsage | None) -> AttemptUsage:
        """These GPU figures with the host's cgroup figures."""
        if host is None:
            return self
        return self.model_copy(update={"cpu_s": host.cpu_s, "peak_memory_mib": host.peak_memory_mib,
                                       "peak_memory_sampled": host.peak_memory_sampled, "peak_tasks": host.peak_tasks})


class GpuUsageMeter:
    """The GPU half of an attempt's usage, from each sample of its processes' GPU memory."""

    def __init__(self) -> None:
        self.peak_mib: dict[int, int] = {}
        self.gpu_s = 0.0
        self._last_ts: float | None = None
        self._last_gpus = 0

    def sampled(self, ts: float, memory_by_gpu: dict[int, int]) -> None:
        """``memory_by_gpu``: MiB the attempt's processes hold on each GPU they use, at ``ts``."""
        if self._last_ts is not None and ts > self._last_ts:
            self.gpu_s += self._last_gpus * min(ts - self._last_ts, _MAX_GAP_S)
        self._last_ts, self._last_gpus = ts, len(memory_by_gpu)
        for gpu, mib in memory_by_gpu.items():
            self.peak_mib[gpu] = max(mib, self.peak_mib.get(gpu, 0))

    def usage(self) -> AttemptUsage:
        """What the samples showed (GPU-seconds unknown when no sample of its host could be read)."""
        return AttemptUsage(gpu_peak_mib=dict(sorted(self.peak_mib.items())),
                            gpu_s=None if self._last_ts is None else round(self.gpu_s, 3))
