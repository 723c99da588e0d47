"""Where a GPU sample goes: each running attempt learns whether its GPUs computed (the idle rule),
and each fault goes to the attempts that use that GPU (an event and an alert each), to the
metrics, and to the daemon's log.

An attempt uses a GPU when one of its processes holds memory there (NVML's process list, matched
with the attempt's tree), or when its spec names that device.  A fault on a GPU no attempt uses
is counted and logged only.  A hardware fault also quarantines the GPU (jobs/quarantine.py): the
next launches there leave it out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import structlog

from supervisor.daemon.metrics import Metrics
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample
from supervisor.jobs.quarantine import Quarantines

log = structlog.get_logger("supervise.gpu")


class SampleTaker(Protocol):
    async def gpus_sampled(self, host: str, sample: GpuSample) -> None:
        """A new sample of ``host``'s GPUs."""
        ...

    async def gpu_fault(self, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
        """Whether the fault concerns this job (and was recorded and alerted)."""
        ...


class GpuRouter:
    def __init__(self, runners: Callable[[], Iterable[SampleTaker]], metrics: Metrics,
                 quarantines: Quarantines | None = None) -> None:
        self._runners = runners
        self._metrics = metrics
        self._quarantines = quarantines

    async def __call__(self, host: str, sample: GpuSample, faults: list[GpuFault]) -> None:
        for runner in list(self._runners()):
            try:
                await runner.gpus_sampled(host, sample)
            except Exception:  # one job's host that cannot be asked must not starve the others
                log.exception("a GPU sample could not be handed to a job", host=host)
        for fault in faults:
            self._metrics.gpu_faults.labels(host, str(fault.gpu), fault.kind.value,
                                            "" if fault.xid is None else str(fault.xid)).inc()
            if self._quarantines is not None and fault.gpu >= 0:
                # Before the jobs are told: a job the fault ends relaunches without that GPU.
                try:
                    await self._quarantines.gpu_fault(host, fault)
                except Exception:  # the fault still reaches the jobs
                    log.exception("a GPU could not be quarantined", host=host, gpu=fault.gpu)
            device_pids = {p.pid for p in sample.processes if p.gpu_index == fault.gpu}
            told = [await _told(runner, host, fault, device_pids) for runner in list(self._runners())]
            log.warning("GPU fault", host=host, gpu=fault.gpu, kind=fault.kind.value, xid=fault.xid,
                        detail=fault.detail, jobs_told=sum(told))


async def _told(runner: SampleTaker, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
    try:
        return await runner.gpu_fault(host, fault, device_pids)
    except Exception:  # a fault reaches the other jobs whatever one of them raises
        log.exception("a GPU fault could not be handed to a job", host=host, gpu=fault.gpu)
        return False
