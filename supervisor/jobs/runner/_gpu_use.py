"""What the running attempt does on its GPUs, from the daemon's samples: the memory and
GPU-seconds it used (its meter), and whether its GPUs computed (the watchdog's idle rule)."""

from __future__ import annotations

from collections.abc import Callable

from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.base import Host
from supervisor.jobs.runner._context import Live
from supervisor.spec.tables import GpuSpec

_PIDS_FRESH_S = 10.0


async def attempt_pids(host: Host, live: Live, clock: Callable[[], float]) -> set[int]:
    """The attempt's processes, looked up at most every ``_PIDS_FRESH_S`` (a scan of the
    process table per GPU sample would cost the loop more than the sample)."""
    now = clock()
    if live.pids_read_at is None or now - live.pids_read_at > _PIDS_FRESH_S:
        live.pids_read_at = now
        live.known_pids |= await host.attempt_pids(live.handle)
    return {live.handle.pid} | live.known_pids


async def gpus_sampled(host: Host, gpu: GpuSpec, live: Live, sample: GpuSample, clock: Callable[[], float]) -> None:
    """What the attempt held of ``sample`` (its meter), and whether its GPUs computed (its watchdog)."""
    ours = await attempt_pids(host, live, clock)
    held: dict[int, int] = {}
    for p in sample.processes:
        if p.pid in ours:
            held[p.gpu_index] = held.get(p.gpu_index, 0) + (p.used_mib or 0)
    if sample.available:  # a host whose GPUs cannot be read says nothing of what the attempt held
        live.gpu_meter.sampled(sample.ts, held)
    if gpu.devices != "all":
        devices = {d for d in gpu.devices if sample.device(d) is not None}
    else:
        devices = set(held)
    utilisation = [u for d in devices if (device := sample.device(d)) and (u := device.util_pct) is not None]
    if not utilisation:
        return  # not on a GPU, or a board that does not tell
    live.watchdog.gpus_sampled(tuple(sorted(devices)), max(utilisation) > 0)
    live.wake_if_sooner(live.watchdog.next_check_at())
