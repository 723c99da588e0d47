"""FakeNvml: a stand-in for the ``pynvml`` module, for machines without a GPU.

It mirrors the real library's behaviour at its API, not the supervisor's needs:
- every call but ``nvmlInit`` raises ``NVMLError_Uninitialized`` before init (and after
  the matching number of ``nvmlShutdown`` calls: NVML counts references);
- memory is reported in bytes, ``used`` including what the driver reserves;
- a process's ``usedGpuMemory`` is ``None`` when the driver cannot tell (pynvml maps
  NVML_VALUE_NOT_AVAILABLE to None);
- a bad index raises ``NVMLError_InvalidArgument``; utilisation, temperature and power can be
  unsupported (MIG slices) and raise ``NVMLError_NotSupported``;
- temperature is in degrees C for the sensor ``NVML_TEMPERATURE_GPU`` (any other sensor is
  ``NVMLError_InvalidArgument``), power usage in milliwatts;
- errors are the real ``pynvml.NVMLError`` subclasses, built the way pynvml builds them;
- health: volatile uncorrected ECC counts (``nvmlDeviceGetTotalEccErrors``), remapped rows as a
  4-tuple (corrected, uncorrected, pending, failure), retired pages pending as
  NVML_FEATURE_ENABLED/DISABLED, the clocks-event reasons bit mask; each can be unsupported
  (``NVMLError_NotSupported``), as on boards without ECC or MIG slices;
- the PCI address (``nvmlDeviceGetPciInfo(...).busId``, bytes as pynvml's structure gives it);
- Xid events: ``nvmlEventSetCreate`` (refused with NotSupported where ``events_supported`` is off), ``nvmlDeviceRegisterEvents`` (for
  ``nvmlEventTypeXidCriticalError``), and ``nvmlEventSetWait_v2`` returning an event whose
  ``device`` is the handle's pointer value, ``eventType`` and ``eventData`` (the Xid code), or
  raising ``NVMLError_Timeout`` when none is waiting.

A test drives its state: add devices and processes, free or re-allocate memory, make a
process exit after a delay (on the fake's clock), or make the memory outlive the process
list for a moment, as the driver does while it tears a context down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import pynvml

MIB = 1024 * 1024

NVMLError = pynvml.NVMLError


def nvml_error(code: int) -> pynvml.NVMLError:
    # NVMLError(code) returns the matching subclass, as inside pynvml.
    return pynvml.NVMLError(code)


@dataclass
class FakeDevice:
    name: str = "NVIDIA H200"
    uuid: str = ""
    total_mib: int = 143771
    reserved_mib: int = 615  # used with no process at all (an H200, driver 580, as NVML reported it)
    util_pct: int = 0
    util_supported: bool = True
    temperature_c: int = 34
    power_mw: int = 76_000
    sensors_supported: bool = True  # temperature and power (not on MIG slices)
    ecc_uncorrected: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure
    retired_pending: bool = False
    throttle_reasons: int = 0x1  # GPU idle: the mask an idle healthy board shows
    health_supported: bool = True
    pci_bus_id: str = ""  # NVML's "00000000:3B:00.0" (set from the index when empty)


@dataclass
class FakeProcess:
    pid: int
    gpu: int
    mib: int
    exits_at: float | None = None  # on the fake's clock: gone from the list from then on
    frees_at: float | None = None  # memory still counted until then (driver teardown lag)
    memory_reported: bool = True  # False: usedGpuMemory is None


class FakeNvml:
    """Module-like: pass it where ``pynvml`` would go (``NvmlSampler(nvml=FakeNvml(...))``)."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock or (lambda: 0.0)
        self.devices: list[FakeDevice] = []
        self.processes: list[FakeProcess] = []
        self.init_error: int | None = None  # an NVML_ERROR_* code nvmlInit fails with
        self.refcount = 0
        self.calls: list[str] = []
        self.event_sets: list[list[SimpleNamespace]] = []  # each set's waiting events
        self.registered: dict[int, list[int]] = {}  # device index -> the sets it reports to
        self.events_supported = True  # False: nvmlEventSetCreate is refused (NVML_ERROR_NOT_SUPPORTED), as in
        # containers and on some virtual GPUs

    # ---- test controls ------------------------------------------------------------

    def add_device(self, **fields: object) -> int:
        index = len(self.devices)
        device = FakeDevice(**fields)  # type: ignore[arg-type]
        if not device.uuid:
            device.uuid = f"GPU-{index:08x}-0000-0000-0000-{index:012x}"
        if not device.pci_bus_id:
            device.pci_bus_id = f"00000000:{0x18 + index * 0x10:02X}:00.0"
        self.devices.append(device)
        return index

    def start_process(self, pid: int, gpu: int, mib: int, *, memory_reported: bool = True) -> FakeProcess:
        process = FakeProcess(pid, gpu, mib, memory_reported=memory_reported)
        self.processes.append(process)
        return process

    def exit_process(self, pid: int, *, after_s: float = 0.0, free_lag_s: float = 0.0) -> None:
        """The process ends ``after_s`` from now; its memory goes ``free_lag_s`` after that."""
        now = self.clock()
        for process in self.processes:
            if process.pid == pid:
                process.exits_at = now + after_s
                process.frees_at = now + after_s + free_lag_s

    def inject_xid(self, gpu: int, code: int) -> None:
        """The driver reports an Xid on ``gpu``: every event set it was registered with gets it."""
        for number in self.registered.get(gpu, []):
            self.event_sets[number].append(SimpleNamespace(device=SimpleNamespace(value=gpu + 1), eventData=code,
                                                           eventType=pynvml.nvmlEventTypeXidCriticalError,
                                                           gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))

    def set_memory(self, pid: int, mib: int) -> None:
        for process in self.processes:
            if process.pid == pid:
                process.mib = mib

    # ---- the pynvml API -----------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._require_init()
        self.refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        self._require_init()
        if not 0 <= index < len(self.devices):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        # pynvml's handle is a fresh ctypes pointer each call; ``value`` is the address it holds.
        return SimpleNamespace(index=index, value=index + 1)

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace, version: int | None = None) -> SimpleNamespace:
        device = self._device(handle)
        used = (device.reserved_mib + self._held_mib(handle.index)) * MIB
        total = device.total_mib * MIB
        return SimpleNamespace(total=total, free=max(0, total - used), used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: SimpleNamespace) -> SimpleNamespace:
        device = self._device(handle)
        if not device.util_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=device.util_pct, memory=0)

    def nvmlDeviceGetTemperature(self, handle: SimpleNamespace, sensor: int) -> int:
        device = self._device(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not device.sensors_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: SimpleNamespace) -> int:
        device = self._device(handle)
        if not device.sensors_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: SimpleNamespace, error_type: int, counter_type: int) -> int:
        device = self._health(handle)
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type != pynvml.NVML_VOLATILE_ECC:
            return 0
        return device.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: SimpleNamespace) -> tuple[int, int, int, int]:
        return self._health(handle).remapped

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimpleNamespace) -> int:
        enabled = self._health(handle).retired_pending
        return pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimpleNamespace) -> int:
        return self._health(handle).throttle_reasons

    def nvmlEventSetCreate(self) -> int:
        self._require_init()
        if not self.events_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.event_sets.append([])
        return len(self.event_sets) - 1

    def nvmlDeviceRegisterEvents(self, handle: SimpleNamespace, event_types: int, event_set: int) -> None:
        self._device(handle)
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self.registered.setdefault(handle.index, []).append(event_set)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        self._require_init()
        waiting = self.event_sets[event_set]
        if not waiting:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return waiting.pop(0)

    def nvmlEventSetFree(self, event_set: int) -> None:
        self.event_sets[event_set] = []

    def nvmlDeviceGetPciInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        # pynvml's c_nvmlPciInfo_t: busId is a char array, read back as bytes
        return SimpleNamespace(busId=self._device(handle).pci_bus_id.encode(), pciDeviceId=0x233510DE)

    def nvmlDeviceGetName(self, handle: SimpleNamespace) -> str:
        return self._device(handle).name

    def nvmlDeviceGetUUID(self, handle: SimpleNamespace) -> str:
        return self._device(handle).uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimpleNamespace) -> list[SimpleNamespace]:
        self._device(handle)
        now = self.clock()
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=p.mib * MIB if p.memory_reported else None,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p in self.processes
            if p.gpu == handle.index and (p.exits_at is None or now < p.exits_at)
        ]

    # ---- internals ---------------------------------------------------------------

    def _require_init(self) -> None:
        if self.refcount <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: SimpleNamespace) -> FakeDevice:
        self._require_init()
        return self.devices[handle.index]

    def _health(self, handle: SimpleNamespace) -> FakeDevice:
        device = self._device(handle)
        if not device.health_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device

    def _held_mib(self, index: int) -> int:
        now = self.clock()
        return sum(p.mib for p in self.processes if p.gpu == index and (p.frees_at is None or now < p.frees_at))
