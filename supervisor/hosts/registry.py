"""The host registry: one live connection and one GPU monitor per host name, made on first use.

`local` always exists; a host named by URL (`ssh://[user@]box[:port]`) is made by `connect`
when a job first names it, from the module its scheme maps to.  Each host's GPU monitor samples
it on a steady interval through `Host.sample_gpus` (NVML locally, nvidia-smi over SSH), keeps
the latest sample for readers, and stores some for reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog

from supervisor.core.config import DaemonSettings
from supervisor.core.errors import SpecError, SuperviseError
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.tasks import cancel_and_wait
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample, new_faults
from supervisor.hosts.base import Host, ListenAddress
from supervisor.store.database import Store

# Told of each available sample, with the host's name and the faults it shows that the last did not.
SampleSink = Callable[[str, GpuSample, list[GpuFault]], Awaitable[None]]

log = structlog.get_logger("supervise.hosts")

@dataclass(frozen=True)
class HostKind:
    """What one kind of host brings, each named by full name and imported on first use, so a daemon
    without such jobs never loads its client (asyncssh, Slurm's commands)."""

    module: str  # the module of its Host class
    host_class: str  # made from the URL
    # "module:function": the address a start looks at first, from the URL (`hosts/reach.py`); None: nothing to
    # look at (this machine, or sbatch run here).
    reach: str | None = None


# A host URL's scheme -> its kind.
_KINDS: dict[str, HostKind] = {
    # ssh://[user@]host[:port]
    "ssh": HostKind("supervisor.hosts.ssh.host", "SshHost", reach="supervisor.hosts.ssh.target:listen_address"),
    # slurm: (sbatch on this machine)
    "slurm": HostKind("supervisor.hosts.slurm.host", "SlurmHost"),
    # slurm+ssh://[user@]login-node[:port] (sbatch there)
    "slurm+ssh": HostKind("supervisor.hosts.slurm.ssh", "SlurmSshHost",
                          reach="supervisor.hosts.slurm.ssh:login_node_address"),
}
_USAGE = "use 'local', 'ssh://[user@]host[:port]', 'slurm:' or 'slurm+ssh://[user@]login-node[:port]'"

# A kind's reach hook: the address to look at before a start on the host a URL names; None: none to look at.
ReachHook = Callable[[str], ListenAddress | None]


def _kind(name: str) -> HostKind | None:
    return _KINDS.get(urlsplit(name).scheme) if "://" in name or name.startswith("slurm:") else None


def connect(name: str) -> Host:
    """The host a job's ``host`` names by URL; `SpecError` for a scheme no module implements."""
    kind = _kind(name)
    if kind is None:
        raise SpecError(f"unknown host '{name}': {_USAGE}")
    module = importlib.import_module(kind.module)
    host: Host = getattr(module, kind.host_class)(name)
    return host


def reach_hook(name: str) -> ReachHook | None:
    """The reach hook of the kind of host ``name`` names (its module imported now); None for `local`, a
    kind with none, or a name no kind implements (`connect` says what is wrong with it)."""
    kind = _kind(name)
    if kind is None or kind.reach is None:
        return None
    module, _, function = kind.reach.partition(":")
    hook: ReachHook = getattr(importlib.import_module(module), function)
    return hook


class GpuMonitor:
    """Samples one host's GPUs on a steady interval; keeps the latest sample; stores some."""

    def __init__(self, host_name: str, store: Store, settings: DaemonSettings, host: Host,
                 on_sample: SampleSink | None = None) -> None:
        self.host_name = host_name
        self.on_sample = on_sample  # told of each sample and the faults it shows that the last did not
        self.store = store
        self.settings = settings
        self._host = host
        self.latest: GpuSample | None = None
        self._last_stored = 0.0
        self._lock = asyncio.Lock()
        self._waiters: list[asyncio.Future[GpuSample]] = []

    async def sample(self) -> GpuSample:
        async with self._lock:  # one reading at a time per host
            sample = await self._host.sample_gpus()
        previous, self.latest = self.latest, sample
        if sample.available and self.on_sample is not None:
            try:
                await self.on_sample(self.host_name, sample, new_faults(previous, sample))
            except Exception:  # what a sample is told to must never stop the sampling
                log.exception("handing a GPU sample on failed", host=self.host_name)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(sample)
        if sample.available and sample.ts - self._last_stored >= self.settings.gpu_store_every_s:
            self._last_stored = sample.ts
            with contextlib.suppress(SuperviseError):
                rows = [(d.index, d.used_mib, d.total_mib, d.util_pct) for d in sample.devices]
                self.store.record_gpu(self.host_name, sample.ts, rows)
        return sample

    async def next_sample(self) -> GpuSample:
        """The next sample taken (by the steady loop, or by anyone): what a wait for GPU memory
        wakes on, instead of sleeping on a timer of its own."""
        waiter: asyncio.Future[GpuSample] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await waiter

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
            # A remote box may be unreachable for a while, a driver loaded later: look again, less often.
            await asyncio.sleep(max(30.0, self.settings.gpu_interval_s))


@dataclass
class HostSlot:
    """A host and the GPU monitor that watches it: what a job on that host needs."""

    host: Host
    gpu: GpuMonitor
    task: asyncio.Task[None] | None = None


class Hosts:
    """One live connection and GPU monitor per host name (`local`, `ssh://user@box`), made on first use."""

    def __init__(self, store: Store, settings: DaemonSettings, local: Host, on_sample: SampleSink | None = None) -> None:
        self.store = store
        self.settings = settings
        self.on_sample = on_sample
        self._slots: dict[str, HostSlot] = {LOCAL_HOST: self._slot(LOCAL_HOST, local)}

    def get(self, name: str) -> HostSlot:
        if name not in self._slots:
            self._slots[name] = self._slot(name, connect(name))
        slot = self._slots[name]
        if slot.task is None:
            slot.task = asyncio.create_task(slot.gpu.run(), name=f"gpu:{name}")
        return slot

    def find(self, name: str) -> HostSlot | None:
        """The slot of a host in use, or None: never makes one (a request cannot grow the registry)."""
        return self._slots.get(name)

    def check(self, name: str) -> None:
        """Parse a host's address (`SpecError`/`HostError` when bad) without keeping a slot: a spec
        that is refused later must leave no connection or sampler behind."""
        if name not in self._slots:
            connect(name)  # builds the host object only; it holds nothing until first used

    def _slot(self, name: str, host: Host) -> HostSlot:
        return HostSlot(host, GpuMonitor(name, self.store, self.settings, host, self.on_sample))

    @property
    def local(self) -> HostSlot:
        return self.get(LOCAL_HOST)

    def items(self) -> list[tuple[str, HostSlot]]:
        """The hosts connected so far (never connects one)."""
        return list(self._slots.items())

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.task is not None:
                await cancel_and_wait(slot.task)
            await slot.host.close()
