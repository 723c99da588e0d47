"""A GPU's health as NVML reports it, and the faults a new sample shows: Xid errors, volatile
uncorrected ECC errors, retired or remapped memory pending, clocks slowed by heat or a power brake.

``read_health`` reads one device (each field None where NVML cannot tell: MIG slices, older
boards, virtual GPUs); ``XidEvents`` drains NVML's Xid event set without waiting (registered once,
read at every sample).  A ``GpuFault`` names what a new sample shows that the last did not, with
its GPU, its kind and, for an Xid, the code and what NVIDIA's documentation says it means
(``gpu.new_faults`` compares two samples with them).
Reading never raises: a board that supports none of it reports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), the codes seen in ML jobs.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (often an illegal memory access in the job's kernel)",
    31: "GPU memory page fault (often an illegal address in the job's kernel)",
    43: "GPU stopped processing (a kernel was killed or hit an error)",
    45: "preemptive cleanup after an error (a process was stopped)",
    48: "double-bit ECC error (uncorrectable memory error: drain the GPU, reset it)",
    63: "ECC page retirement or row remapping recorded (reset the GPU to apply it)",
    64: "ECC page retirement or row remapping failed (the GPU needs service)",
    74: "NVLink error (a link between GPUs failed: check the fabric)",
    79: "GPU has fallen off the bus (hardware or power fault: the node needs attention)",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected process was stopped; others run on)",
    95: "uncontained ECC error (every process on the GPU is affected: reset it)",
}

# Clock slowdowns that mean the hardware is in trouble (not an idle GPU's, or an application cap).
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_WORDS = {THROTTLE_HW_SLOWDOWN: "hardware slowdown", THROTTLE_SW_THERMAL: "thermal slowdown (software)",
                   THROTTLE_HW_THERMAL: "thermal slowdown (hardware)", THROTTLE_HW_POWER_BRAKE: "power brake"}
_MAX_XIDS_PER_SAMPLE = 32


class FaultKind(StrEnum):
    XID = "xid"
    ECC_UNCORRECTED = "ecc_uncorrected"
    PAGES_PENDING = "pages_pending"  # retired pages or remapped rows waiting for a reset
    REMAP_FAILED = "remap_failed"
    THROTTLED = "throttled"  # thermal, power brake, hardware slowdown


@dataclass(frozen=True)
class DeviceHealth:
    ecc_uncorrected: int | None = None  # volatile (since the last driver load) uncorrected ECC errors
    pages_pending: bool | None = None  # retired pages or remapped rows pending a reset
    remap_failed: bool | None = None
    throttle_reasons: int | None = None  # NVML's clocks-event bit mask


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    code: int
    repeats: int = 1  # how many times this code was reported on this GPU since the last sample


def fold_xids(xids: Iterable[XidEvent]) -> tuple[XidEvent, ...]:
    """One event per GPU and code, counting its repeats, and at most _MAX_XIDS_PER_SAMPLE of them:
    a driver that floods its log (100,000 lines) is one fault to tell, not 100,000 to store,
    alert and match with every job's processes on the daemon's loop."""
    folded: dict[tuple[int, int], int] = {}
    for xid in xids:
        key = (xid.gpu, xid.code)
        if key in folded or len(folded) < _MAX_XIDS_PER_SAMPLE:
            folded[key] = folded.get(key, 0) + xid.repeats
    return tuple(XidEvent(gpu, code, repeats) for (gpu, code), repeats in folded.items())


@dataclass(frozen=True)
class GpuFault:
    gpu: int
    kind: FaultKind
    detail: str
    xid: int | None = None

    @property
    def serious(self) -> bool:
        """Whether the GPU's work is likely wrong or lost (a failure), not only slower (a warning)."""
        return self.kind is not FaultKind.THROTTLED

    def describe(self) -> str:
        return f"GPU {self.gpu}: {self.detail}"


def xid_detail(code: int, repeats: int = 1) -> str:
    times = f" ({repeats:,} times since the last sample)" if repeats > 1 else ""
    return f"Xid {code}: {XID_MEANINGS.get(code, 'see NVIDIA Xid catalogue')}{times}"


def read_health(nvml: Any, handle: Any) -> DeviceHealth:
    def optional(read: Any) -> Any:
        try:
            return read()
        except Exception:  # noqa: BLE001 - not supported, not permitted: unknown
            return None

    ecc = optional(lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                                 nvml.NVML_VOLATILE_ECC)))
    remapped = optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))  # (corrected, uncorrected, pending, failed)
    retired = optional(lambda: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)))
    pending = None
    if remapped is not None or retired is not None:
        pending = bool(remapped is not None and remapped[2]) or bool(retired)
    throttle = optional(lambda: int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)))
    if throttle is None:
        throttle = optional(lambda: int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
    return DeviceHealth(ecc_uncorrected=ecc, pages_pending=pending,
                        remap_failed=None if remapped is None else bool(remapped[3]), throttle_reasons=throttle)


class XidEvents:
    """NVML's Xid critical-error events for every device, drained without waiting at each sample.
    Registration may be refused (no permission, an unsupported board): then no Xid is reported."""

    def __init__(self) -> None:
        self._set: Any = None
        self._index: dict[Any, int] = {}
        self.note = ""

    def register(self, nvml: Any, handles: Sequence[Any]) -> None:
        if self._set is not None:
            return
        try:
            self._set = nvml.nvmlEventSetCreate()
        except Exception as exc:  # noqa: BLE001
            self.note = f"Xid events unavailable: {exc}"
            return
        for index, handle in enumerate(handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
                self._index[_key(handle)] = index
            except Exception as exc:  # noqa: BLE001
                self.note = f"Xid events unavailable on GPU {index}: {exc}"

    @property
    def registered(self) -> set[int]:
        """The GPUs (indices) whose Xids this event set reports."""
        return set(self._index.values())

    def drain(self, nvml: Any) -> tuple[XidEvent, ...]:
        if self._set is None:
            return ()
        found = []
        for _ in range(_MAX_XIDS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: none waiting
                break
            if int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                found.append(XidEvent(self._index.get(_key(data.device), -1), int(data.eventData)))
        return tuple(found)

    def close(self, nvml: Any) -> None:
        if self._set is not None:
            try:
                nvml.nvmlEventSetFree(self._set)
            except Exception:  # noqa: BLE001
                pass
        self._set, self._index = None, {}


def _key(handle: Any) -> Any:
    # pynvml hands back a new ctypes pointer object each time: compare the address it holds.
    value = getattr(handle, "value", None)
    if value is not None:
        return value
    contents = getattr(handle, "contents", None)
    if contents is not None:
        import ctypes

        return ctypes.addressof(contents)
    return getattr(handle, "index", id(handle))
