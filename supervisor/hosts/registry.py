"""The host registry: one live connection and one GPU monitor per host name, made on first use.

`local` always exists; `ssh://[user@]box[:port]` hosts are connected when a job first names
one.  Each host's GPU monitor samples it on a steady interval (through the host itself: NVML
locally, nvidia-smi over SSH), keeps the latest sample for readers, and stores some for reports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..config import DaemonSettings
from ..errors import SpecError, SuperviseError
from ..gpu import GpuSample, NvmlSampler
from ..store import Store
from .base import Host

log = structlog.get_logger("supervise.hosts")


class GpuMonitor:
    """Samples one host's GPUs on a steady interval; keeps the latest sample; stores some."""

    def __init__(self, host_name: str, store: Store, settings: DaemonSettings,
                 read: Callable[[], Awaitable[GpuSample]]) -> None:
        self.host_name = host_name
        self.store = store
        self.settings = settings
        self._read = read
        self.latest: GpuSample | None = None
        self._last_stored = 0.0
        self._lock = asyncio.Lock()

    async def sample(self) -> GpuSample:
        async with self._lock:  # one reading at a time per host
            sample = await self._read()
        self.latest = sample
        if sample.available and sample.ts - self._last_stored >= self.settings.gpu_store_every_s:
            self._last_stored = sample.ts
            with contextlib.suppress(SuperviseError):
                rows = [(d.index, d.used_mib, d.total_mib, d.util_pct) for d in sample.devices]
                self.store.record_gpu(self.host_name, sample.ts, rows)
        return sample

    async def run(self) -> None:
        said_off = False
        while True:
            sample = await self.sample()
            if sample.available:
                said_off = False
                await asyncio.sleep(self.settings.gpu_interval_s)
                continue
            if not said_off:
                log.info("GPU sampling is off", host=self.host_name, reason=sample.reason)
                said_off = True
            if self.host_name == "local":
                return  # no driver here will not change while the daemon runs
            # A remote box may be unreachable for a while: look again, less often.
            await asyncio.sleep(max(30.0, self.settings.gpu_interval_s))


@dataclass
class HostSlot:
    """A host and the GPU monitor that watches it: what a job on that host needs."""

    host: Host
    gpu: GpuMonitor
    task: asyncio.Task[None] | None = None


class Hosts:
    """One live connection and GPU monitor per host name (`local`, `ssh://user@box`), made on first use."""

    def __init__(self, store: Store, settings: DaemonSettings, local: Host, nvml: Any | None) -> None:
        self.store = store
        self.settings = settings
        self._slots: dict[str, HostSlot] = {}
        sampler = NvmlSampler(nvml=nvml)
        self._local_sampler = sampler
        self._slots["local"] = HostSlot(local, GpuMonitor("local", store, settings, lambda: asyncio.to_thread(sampler.sample)))

    def get(self, name: str) -> HostSlot:
        if name not in self._slots:
            self._slots[name] = self._connect(name)
        slot = self._slots[name]
        if slot.task is None:
            slot.task = asyncio.create_task(slot.gpu.run(), name=f"gpu:{name}")
        return slot

    def _connect(self, name: str) -> HostSlot:
        if not name.startswith("ssh://"):
            raise SpecError(f"unknown host '{name}': use 'local' or 'ssh://[user@]host[:port]'")
        from .ssh import SshHost

        host = SshHost(name)
        return HostSlot(host, GpuMonitor(name, self.store, self.settings, host.sample_gpus))

    @property
    def local(self) -> HostSlot:
        return self.get("local")

    def items(self) -> list[tuple[str, HostSlot]]:
        """The hosts connected so far (never connects one)."""
        return list(self._slots.items())

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.task is not None:
                slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await slot.task
            await slot.host.close()
        self._local_sampler.close()
