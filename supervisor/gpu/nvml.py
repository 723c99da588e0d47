"""GPU memory per device and per process, from NVML, and waiting for an attempt's memory
to be released before the next attempt starts.

``NvmlSampler.sample()`` is synchronous (NVML calls block briefly); the daemon runs it in
a thread.  It never raises: without a driver or library it returns a sample with
``available=False`` and the reason, so a CPU-only box works unchanged.

Device indices are NVML's (those ``nvidia-smi`` shows, PCI bus order), which match
``CUDA_VISIBLE_DEVICES`` only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.gpu.health import (
    THROTTLE_WORDS,
    DeviceHealth,
    FaultKind,
    GpuFault,
    XidEvent,
    XidEvents,
    fold_xids,
    read_health,
    xid_detail,
)
from supervisor.gpu.kernel_xids import KmsgReader, to_events

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int
    util_pct: int | None
    temperature_c: int | None = None  # None where NVML cannot tell (MIG slices, some virtual GPUs)
    power_w: float | None = None
    health: DeviceHealth | None = None  # ECC, pending retirements, slowdowns (gpu.health)
    pci_bus_id: str = ""  # "00000000:3B:00.0": how the kernel log names the GPU in an Xid line


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu_index: int
    used_mib: int | None  # None where the driver cannot tell (NVML reports "not available")


@dataclass(frozen=True)
class GpuSample:
    ts: float
    available: bool
    reason: str
    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcess, ...]
    xids: tuple[XidEvent, ...] = ()  # Xid errors NVML reported since the previous sample

    def device(self, index: int) -> GpuDevice | None:
        return next((d for d in self.devices if d.index == index), None)


@dataclass(frozen=True)
class XidSource:
    readable: bool
    text: str


class NvmlSampler:
    """Reads NVML; ``nvml`` is the ``pynvml`` module or anything with the same functions."""

    def __init__(self, nvml: Any | None = None, *, clock: Callable[[], float] = time.time,
                 kernel_log: KmsgReader | None = None) -> None:
        """``kernel_log``: where Xids are read for the GPUs NVML's event set cannot report (None: nowhere)."""
        self._nvml = nvml
        self._clock = clock
        self._initialised = False
        self._xids = XidEvents()
        self._kernel_log = kernel_log

    def sample(self) -> GpuSample:
        ts = self._clock()
        try:
            nvml = self._module()
            self._init(nvml)
            devices, processes = self._read(nvml)
            xids = fold_xids(self._xids.drain(nvml) + self._kernel_xids(devices))
        except Exception as exc:  # noqa: BLE001 - a sampler that raises would stop the daemon's GPU view
            if _is_uninitialised(exc):
                self._initialised = False  # someone shut NVML down; initialise again next time
                self._xids = XidEvents()
            return GpuSample(ts, False, f"NVML unavailable: {_describe(exc)}", (), ())
        return GpuSample(ts, True, "", tuple(devices), tuple(processes), xids)

    def _kernel_xids(self, devices: list[GpuDevice]) -> tuple[XidEvent, ...]:
        # The kernel log carries the same driver reports as NVML's event set: read only for the
        # GPUs the event set does not cover (so that no Xid is told twice).
        unregistered = {d.index: d.pci_bus_id for d in devices if d.index not in self._xids.registered}
        if self._kernel_log is None or not unregistered:
            return ()
        return tuple(x for x in to_events(self._kernel_log.read_new(), unregistered) if x.gpu in unregistered)

    def xid_source(self) -> XidSource:
        """Where this sampler's Xid errors come from (after a sample): for `doctor`."""
        if self._xids.registered and not self._xids.note:
            return XidSource(True, "from NVML's event set")
        why = self._xids.note or "NVML's event set is not registered"
        if self._kernel_log is not None and not self._kernel_log.note:
            return XidSource(True, f"from the kernel log {self._kernel_log.path} ({why})")
        where = f"; {self._kernel_log.note}" if self._kernel_log is not None else ""
        return XidSource(False, f"not seen: {why}{where} (ECC, pending pages and slowdowns still are; run the "
                                "daemon as root or with CAP_SYSLOG to read the kernel log)")

    def close(self) -> None:
        if self._kernel_log is not None:
            self._kernel_log.close()
        if not self._initialised or self._nvml is None:
            return
        self._initialised = False
        self._xids.close(self._nvml)
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # imported here so a box without it still samples (as unavailable)

            self._nvml = pynvml
        return self._nvml

    def _init(self, nvml: Any) -> None:
        # Retried on every sample until it works: the driver may be loaded after we start.
        if not self._initialised:
            nvml.nvmlInit()
            self._initialised = True

    def _read(self, nvml: Any) -> tuple[list[GpuDevice], list[GpuProcess]]:
        devices: list[GpuDevice] = []
        processes: list[GpuProcess] = []
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
        self._xids.register(nvml, handles)
        for index, handle in enumerate(handles):
            devices.append(_read_device(nvml, index, handle))
            processes.extend(_read_processes(nvml, index, handle))
        return devices, processes


def _read_device(nvml: Any, index: int, handle: Any) -> GpuDevice:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuDevice(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        used_mib=int(memory.used) // MIB,
        total_mib=int(memory.total) // MIB,
        util_pct=_optional(nvml, lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
        temperature_c=_optional(nvml, lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
        power_w=_optional(nvml, lambda: int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000),  # NVML says milliwatts
        health=read_health(nvml, handle),
        pci_bus_id=_pci_bus_id(nvml, handle),
    )


def _pci_bus_id(nvml: Any, handle: Any) -> str:
    try:
        return _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except Exception:  # noqa: BLE001 - unknown: its Xids in the kernel log cannot be placed
        return ""


def _optional(nvml: Any, read: Callable[[], Any]) -> Any:
    # Utilisation, temperature and power are not supported on MIG slices and some virtual
    # GPUs; memory matters more than these, so one that cannot be read is shown as unknown.
    try:
        return read()
    except nvml.NVMLError:
        return None


def _read_processes(nvml: Any, index: int, handle: Any) -> list[GpuProcess]:
    found = []
    for info in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(info, "usedGpuMemory", None)
        found.append(GpuProcess(int(info.pid), index, None if used is None else int(used) // MIB))
    return found


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{text} ({type(exc).__name__})"


def _is_uninitialised(exc: BaseException) -> bool:
    return type(exc).__name__ == "NVMLError_Uninitialized"


# ---- after an attempt: waiting for its GPU memory to go ----------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    index: int
    used_mib: int
    baseline_mib: int
    tolerance_mib: int

    @property
    def excess_mib(self) -> int:
        return max(0, self.used_mib - self.baseline_mib)

    @property
    def released(self) -> bool:
        return self.used_mib <= self.baseline_mib + self.tolerance_mib


@dataclass(frozen=True)
class ReleaseResult:
    released: bool
    waited_s: float
    reason: str
    devices: tuple[DeviceMemory, ...]
    leftovers: tuple[GpuProcess, ...]  # the attempt's processes still holding memory
    others: tuple[GpuProcess, ...]  # other processes on devices still above their baseline


async def wait_for_release(
    sample: Callable[[], Awaitable[GpuSample]],
    devices: list[int] | None,
    baseline: dict[int, int],
    attempt_pids: Callable[[], set[int]],
    *,
    tolerance_mib: int,
    timeout_s: float,
    interval_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> ReleaseResult:
    """Poll until no attempt pid holds GPU memory and every device is back to its baseline.

    ``baseline`` maps device index to the MiB used before the attempt started; a device
    missing from it must come back to 0 (plus tolerance).  While NVML is unavailable the
    release cannot be confirmed, so it is never reported as released.
    """
    start = clock()
    while True:
        current = await sample()
        result = _judge_release(current, devices, baseline, attempt_pids(), tolerance_mib)
        waited = clock() - start
        if result.released or waited >= timeout_s:
            return _finish(result, waited, timeout_s)
        await sleep(min(interval_s, max(0.0, timeout_s - waited)))


def _judge_release(
    current: GpuSample, devices: list[int] | None, baseline: dict[int, int], pids: set[int], tolerance_mib: int
) -> ReleaseResult:
    if not current.available:
        return ReleaseResult(False, 0.0, f"cannot confirm release: {current.reason}", (), (), ())
    chosen = _selected(current.devices, devices)
    memory = tuple(DeviceMemory(d.index, d.used_mib, baseline.get(d.index, 0), tolerance_mib) for d in chosen)
    indices = {d.index for d in chosen}
    busy = {m.index for m in memory if not m.released}
    ours = tuple(p for p in current.processes if p.gpu_index in indices and p.pid in pids)
    others = tuple(p for p in current.processes if p.gpu_index in busy and p.pid not in pids)
    released = not ours and not busy
    return ReleaseResult(released, 0.0, "", memory, ours, others)


def _finish(result: ReleaseResult, waited: float, timeout_s: float) -> ReleaseResult:
    if result.released:
        reason = f"GPU memory released after {waited:.2f}s"
    elif result.reason:
        reason = f"{result.reason} (gave up after {waited:.1f}s)"
    else:
        reason = f"GPU memory not released within {timeout_s:g}s: {_holders(result)}"
    return ReleaseResult(result.released, waited, reason, result.devices, result.leftovers, result.others)


def _holders(result: ReleaseResult) -> str:
    parts = [f"pid {p.pid} holds {_mib(p.used_mib)} on GPU {p.gpu_index}" for p in result.leftovers]
    parts += [
        f"GPU {m.index} uses {m.used_mib} MiB (baseline {m.baseline_mib} + tolerance {m.tolerance_mib})"
        for m in result.devices
        if not m.released
    ]
    parts += [f"pid {p.pid} (not ours) holds {_mib(p.used_mib)} on GPU {p.gpu_index}" for p in result.others]
    return "; ".join(parts) or "unknown holder"


def _mib(value: int | None) -> str:
    return "an unknown amount" if value is None else f"{value} MiB"


def _selected(all_devices: Iterable[GpuDevice], devices: list[int] | None) -> list[GpuDevice]:
    return [d for d in all_devices if devices is None or d.index in devices]


def foreign_processes(sample: GpuSample, devices: list[int] | None, our_pids: set[int]) -> list[GpuProcess]:
    """Processes that hold memory on the job's devices and are not ours (pre-launch check)."""
    wanted = {d.index for d in _selected(sample.devices, devices)}
    return [p for p in sample.processes if p.gpu_index in wanted and p.pid not in our_pids]


def baseline_of(sample: GpuSample, devices: list[int] | None) -> dict[int, int]:
    """Memory used per device now: the baseline to compare with after the attempt."""
    return {d.index: d.used_mib for d in _selected(sample.devices, devices)}


def describe_memory(sample: GpuSample, devices: list[int] | None = None) -> str:
    """One line for alerts and status: 'GPU 0: 29640/143771 MiB, GPU 1: 4/143771 MiB'."""
    if not sample.available:
        return sample.reason
    chosen = _selected(sample.devices, devices)
    return ", ".join(f"GPU {d.index}: {d.used_mib}/{d.total_mib} MiB" for d in chosen) or "no GPUs"


__all__ = [
    "DeviceMemory",
    "GpuDevice",
    "GpuProcess",
    "GpuSample",
    "NvmlSampler",
    "ReleaseResult",
    "baseline_of",
    "describe_memory",
    "foreign_processes",
    "new_faults",
    "wait_for_release",
]


def new_faults(previous: GpuSample | None, current: GpuSample) -> list[GpuFault]:
    """What ``current`` shows that ``previous`` did not: each Xid event, a rise of uncorrected ECC
    errors, pages pending or a failed remap newly set, a hardware slowdown newly begun."""
    if not current.available:
        return []
    found = [GpuFault(x.gpu, FaultKind.XID, xid_detail(x.code, x.repeats), x.code) for x in current.xids]
    before = {d.index: d.health for d in previous.devices} if previous is not None and previous.available else {}
    for device in current.devices:
        now, then = device.health, before.get(device.index)
        if now is None:
            continue
        then = then or DeviceHealth()
        if now.ecc_uncorrected and now.ecc_uncorrected > (then.ecc_uncorrected or 0):
            found.append(GpuFault(device.index, FaultKind.ECC_UNCORRECTED,
                                  f"{now.ecc_uncorrected - (then.ecc_uncorrected or 0)} new volatile uncorrected ECC "
                                  f"error(s) ({now.ecc_uncorrected} since the driver loaded)"))
        if now.pages_pending and not then.pages_pending:
            found.append(GpuFault(device.index, FaultKind.PAGES_PENDING,
                                  "retired pages or remapped rows pending: reset the GPU when it is free"))
        if now.remap_failed and not then.remap_failed:
            found.append(GpuFault(device.index, FaultKind.REMAP_FAILED, "row remapping failed: the GPU needs service"))
        bad = (now.throttle_reasons or 0) & ~(then.throttle_reasons or 0)
        words = [w for bit, w in THROTTLE_WORDS.items() if bad & bit]
        if words:
            found.append(GpuFault(device.index, FaultKind.THROTTLED, "clocks slowed: " + ", ".join(words)))
    return found
