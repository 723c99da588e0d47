"""Keeping jobs away from a bad GPU or host for a while.

A hardware fault on a GPU (an Xid that means the board, not the job's code, is at fault; an
uncorrected ECC error; memory pages pending a reset; a failed remap) quarantines that GPU for
``quarantine_gpu_s``.  A host whose attempts end ``killed`` (a SIGKILL nobody here sent) or
become ``unreachable`` ``quarantine_strikes`` times in a row is quarantined for
``quarantine_host_s``; any other end of an attempt there starts the count again.  While one
holds, a job with ``gpu.devices = "all"`` is launched without that GPU in CUDA_VISIBLE_DEVICES,
a job that names it waits, and a job with a host pool (``hosts``) goes to a healthy host.

Quarantines are stored (a daemon restart keeps them) and expire by themselves; `supervise
quarantine --clear HOST[:GPU]` lifts one at once.  The count of a host's verdicts is kept in
memory only: a restart forgets a strike, never a quarantine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from supervisor.core import protocol
from supervisor.core.events import Verdict
from supervisor.gpu.health import FaultKind, GpuFault
from supervisor.jobs.pending import when_free
from supervisor.store.database import Store
from supervisor.store.quarantine import Quarantine, QuarantineStore

log = structlog.get_logger("supervise.quarantine")

# Xids that say the board is at fault (NVIDIA's catalogue): double-bit ECC, row remap recorded or
# failed, NVLink, fallen off the bus, high single-bit rate, contained and uncontained ECC.  An Xid
# 13 or 31 is usually the job's own kernel: another GPU would not help it.
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
_HARDWARE_KINDS = frozenset({FaultKind.ECC_UNCORRECTED, FaultKind.PAGES_PENDING, FaultKind.REMAP_FAILED})
UNREACHABLE = "unreachable"  # not a verdict (the attempt waits for its host), but a strike on the host


def quarantines_gpu(fault: GpuFault) -> bool:
    """Whether the fault is the board's (quarantine it), not the job's or only a slowdown."""
    if fault.kind is FaultKind.XID:
        return fault.xid in HARDWARE_XIDS
    return fault.kind in _HARDWARE_KINDS


@dataclass(frozen=True)
class QuarantineRules:
    """The daemon's settings for it (core/config.py); 0 s turns that kind of quarantine off."""

    gpu_s: float = 3600.0
    host_s: float = 900.0
    host_after: int = 2


def check_place(text: str) -> str:
    """`HOST` or `HOST:GPU` as a user writes it: ValueError (one line, what to write) when it
    cannot be either."""
    if not text.strip() or len(text) > 1000 or any(ord(c) < 32 for c in text):
        raise ValueError(f"expected HOST or HOST:GPU (e.g. local or local:1), got {text[:40]!r}")
    return text.strip()


def resolve_place(text: str, held: list[Quarantine]) -> tuple[str, int | None] | None:
    """Which quarantine ``text`` names: a host as written (an SSH URL may end in its port, so the
    whole text is tried first), else `HOST:GPU`; None when it names none that holds."""
    if any(q.host == text for q in held):
        return text, None
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit() and any(q.host == head and q.gpu == int(tail) for q in held):
        return head, int(tail)
    return None


def quarantine_infos(held: list[Quarantine]) -> list[protocol.QuarantineInfo]:
    return [protocol.QuarantineInfo(host=q.host, gpu=q.gpu, place=q.place, reason=q.reason, since=q.since,
                                    until=q.until) for q in held]


class Quarantines:
    """The daemon's quarantines: what is kept away from now, and the rules that put it there."""

    def __init__(self, store: Store, rules: QuarantineRules, clock: Callable[[], float] = time.time) -> None:
        self._rows = QuarantineStore(store)
        self.rules = rules
        self._clock = clock
        self._strikes: dict[str, int] = {}
        self._active: list[Quarantine] = self._rows.active(clock())

    def active(self) -> list[Quarantine]:
        now = self._clock()
        return [q for q in self._active if q.until > now]

    def host(self, host: str) -> Quarantine | None:
        """The host's own quarantine, if it holds now."""
        return next((q for q in self.active() if q.host == host and q.gpu is None), None)

    def gpus(self, host: str) -> dict[int, Quarantine]:
        """The host's quarantined GPUs, by index."""
        return {q.gpu: q for q in self.active() if q.host == host and q.gpu is not None}

    async def gpu_fault(self, host: str, fault: GpuFault) -> Quarantine | None:
        """A fault on ``host``'s GPU: quarantined when it is the board's."""
        if not quarantines_gpu(fault) or self.rules.gpu_s <= 0:
            return None
        return await self._put(host, fault.gpu, fault.describe(), self.rules.gpu_s)

    async def attempt_ended(self, host: str, verdict: Verdict | str) -> Quarantine | None:
        """An attempt on ``host`` ended with ``verdict`` (or its host became unreachable): a strike
        for `killed` and `unreachable`, the count cleared by anything else."""
        if verdict not in (Verdict.KILLED, UNREACHABLE):
            self._strikes.pop(host, None)
            return None
        strikes = self._strikes[host] = self._strikes.get(host, 0) + 1
        if strikes < self.rules.host_after or self.rules.host_s <= 0:
            return None
        self._strikes.pop(host, None)
        word = "killed or unreachable" if strikes > 1 else "killed" if verdict is Verdict.KILLED else "unreachable"
        last = "the last attempt" if strikes == 1 else f"the last {strikes} attempts"
        return await self._put(host, None, f"{last} there ended {word}", self.rules.host_s)

    async def clear(self, host: str, gpu: int | None) -> int:
        """Lift ``host``'s quarantine (gpu None: the host's and each of its GPUs'); how many went."""
        removed = await when_free(lambda: self._rows.clear(host, gpu, whole_host=gpu is None), within_s=5.0)
        self._active = [q for q in self._active if not (q.host == host and (gpu is None or q.gpu == gpu))]
        if gpu is None:
            self._strikes.pop(host, None)
        return removed

    async def _put(self, host: str, gpu: int | None, reason: str, length_s: float) -> Quarantine:
        now = self._clock()
        entry = Quarantine(host, gpu, reason, now, now + length_s)
        await when_free(lambda: self._rows.put(entry))
        self._active = [q for q in self._active if (q.host, q.gpu) != (host, gpu) and q.until > now] + [entry]
        log.warning("quarantined", place=entry.place, reason=reason, until=entry.until)
        return entry
