"""Xid errors as the NVIDIA driver writes them to the kernel log, for hosts where NVML's event set
cannot be had (a container without the permission, a remote box read with nvidia-smi):

    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.

The line names the GPU by its PCI address, which ``gpu_index`` maps to NVML's index through the
sample's devices.  Two readers: ``KmsgReader`` follows the local ``/dev/kmsg`` from the moment it
is opened (records written before are not news), without blocking; ``XidCursor`` keeps, for a
remote box whose ``dmesg`` is read whole at each sample, the kernel time of the last line seen.
Neither raises: a kernel log that cannot be read gives no Xid, and says why in ``note``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.gpu.health import XidEvent

# "PCI:0000:3b:00" (domain:bus:device, sometimes ".function"); newer drivers print the same.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-9a-fA-F])?\): (\d+)")
# dmesg's "[ 1234.567890] " and journalctl -o short-monotonic's "[ 1234.567890] host kernel: "
_KERNEL_TIME = re.compile(r"^\s*\[\s*(\d+(?:\.\d+)?)\]")
KMSG = "/dev/kmsg"
_RECORD_MAX = 8192  # /dev/kmsg hands one record per read and refuses a buffer smaller than it
# A log flooding faster than we read must not hold the sampler (a thread of its own: never the
# loop); a whole ring buffer (a few MB of records) is read in one sample, and its Xids folded.
_MAX_RECORDS_PER_READ = 65536


@dataclass(frozen=True)
class KernelXid:
    pci: tuple[int, int, int]  # domain, bus, device
    code: int
    at: float = 0.0  # kernel time (seconds since boot) where the log gives it


def parse_xid(text: str) -> KernelXid | None:
    match = _XID.search(text)
    if match is None:
        return None
    domain, bus, device, code = match.groups()
    stamp = _KERNEL_TIME.match(text)
    return KernelXid((int(domain, 16), int(bus, 16), int(device, 16)), int(code),
                     float(stamp.group(1)) if stamp else 0.0)


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """NVML's and nvidia-smi's "00000000:3B:00.0" as (domain, bus, device); None if not one."""
    parts = bus_id.strip().split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def to_events(xids: Iterable[KernelXid], pci_of_index: dict[int, str]) -> tuple[XidEvent, ...]:
    """Each Xid on the GPU at its PCI address (index -1: a board this sample does not show)."""
    by_pci = {key: index for index, bus in pci_of_index.items() if (key := pci_key(bus)) is not None}
    return tuple(XidEvent(by_pci.get(x.pci, -1), x.code) for x in xids)


class KmsgReader:
    """New records of the local kernel log, read without waiting at each sample."""

    def __init__(self, path: str = KMSG) -> None:
        self.path = path
        self.note = ""
        self._fd: int | None = None
        self._opened = False
        self._partial = b""

    def read_new(self) -> list[KernelXid]:
        if not self._opened:
            self._open()
        if self._fd is None:
            return []
        found: list[KernelXid] = []
        for _ in range(_MAX_RECORDS_PER_READ):
            try:
                data = os.read(self._fd, _RECORD_MAX)
            except BlockingIOError:
                break  # nothing new
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them: go on with the next
                self.note = f"kernel log {self.path} unreadable: {exc.strerror or exc}"
                self.close()
                break
            if not data:
                break  # a plain file at its end (the kernel's device never says so)
            found += self._records(data)
        return found

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        self._opened = True
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)  # what the kernel logged before we started is not news
        except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte (a bad setting)
            self.note = f"kernel log {self.path!r} not readable: {getattr(exc, 'strerror', None) or exc}"
            self.close()

    def _records(self, data: bytes) -> list[KernelXid]:
        # /dev/kmsg: "PRIO,SEQ,USEC,FLAGS;message\n" then " KEY=value" lines; a plain file may cut anywhere.
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-_RECORD_MAX:]
        found = []
        for raw in lines:
            if raw.startswith(b" ") or b"NVRM: Xid" not in raw:
                continue
            text = raw.decode(errors="replace")
            _, sep, message = text.partition(";")
            xid = parse_xid(message if sep else text)
            if xid is not None:
                found.append(xid)
        return found


class XidCursor:
    """For a kernel log read whole at each sample (a remote box's ``dmesg``): only the lines after
    the last one seen are news; the first reading only sets the mark."""

    def __init__(self) -> None:
        self._last: float | None = None

    def new(self, xids: list[KernelXid]) -> list[KernelXid]:
        latest = max((x.at for x in xids), default=0.0)
        if self._last is None:
            self._last = latest
            return []
        if latest < self._last:  # the box rebooted: kernel time started again
            self._last = 0.0
        fresh = [x for x in xids if x.at > self._last]
        self._last = max(self._last, latest)
        return fresh
