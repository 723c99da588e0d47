"""Parsers for what the remote scripts (``_remote``) print: launch lines, pid lists, kill
reports, nvidia-smi CSV (memory, processes, health), the kernel log's Xid lines and the doctor's
key=value facts."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass, replace

from supervisor.gpu.health import DeviceHealth, XidEvent, fold_xids
from supervisor.gpu.kernel_xids import XidCursor, parse_xid, to_events
from supervisor.gpu.nvml import GpuDevice, GpuProcess, GpuSample
from supervisor.hosts import _remote
from supervisor.hosts.base import ExitStatus, KillReport, LogStat


@dataclass(frozen=True)
class Launched:
    pid: int
    start: str  # '-' when the wrapper had already ended
    pgid: int


def parse_launch(out: bytes) -> Launched | int | None:
    """'launched PID START PGID' -> Launched; 'ended CODE' -> the exit code; else None."""
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "launched" and parts[1].isdigit() and parts[3].isdigit():
            return Launched(int(parts[1]), parts[2], int(parts[3]))
        if len(parts) >= 1 and parts[0] == "ended":
            code = parts[1] if len(parts) > 1 else ""
            return int(code) if code.lstrip("-").isdigit() else -1
    return None


def parse_pids(out: bytes) -> set[int]:
    return {int(word) for word in out.split() if word.isdigit()}


def parse_kill(out: bytes) -> KillReport:
    names: dict[int, str] = {}
    learned_before_grace: list[int] = []
    alive_after_grace: set[int] = set()
    grace_over = False
    report = KillReport()
    for raw in out.decode(errors="replace").splitlines():
        kind, _, rest = raw.partition(" ")
        pid_text, _, name = rest.partition(" ")
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if kind == "N":
            names.setdefault(pid, name.strip()[:120] or "?")
            if not grace_over:
                learned_before_grace.append(pid)
        elif kind == "A":
            grace_over = True
            alive_after_grace.add(pid)
        elif kind == "K":
            grace_over = True
            report.killed.append((pid, names.get(pid, "?")))
        elif kind == "S":
            report.survivors.append((pid, names.get(pid, "?")))
        elif kind == "R":
            report.reparented.append(pid)
    report.terminated = [(pid, names[pid]) for pid in learned_before_grace if pid not in alive_after_grace]
    return report


def _number(text: str) -> int | None:
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", ...


def parse_gpus(lines: Iterable[str]) -> list[GpuDevice]:
    devices = []
    for row in csv.reader(lines, skipinitialspace=True):
        if len(row) < 6:
            continue
        index = _number(row[0])
        if index is None:
            continue
        devices.append(GpuDevice(index=index, uuid=row[1].strip(), name=row[2].strip(),
                                 used_mib=_number(row[3]) or 0, total_mib=_number(row[4]) or 0,
                                 util_pct=_number(row[5])))
    return devices


def parse_apps(lines: Iterable[str], devices: list[GpuDevice]) -> list[GpuProcess]:
    by_uuid = {d.uuid: d.index for d in devices}
    found = []
    for row in csv.reader(lines, skipinitialspace=True):
        if len(row) < 3:
            continue
        pid = _number(row[0])
        index = by_uuid.get(row[1].strip())
        if pid is None or index is None:
            continue
        found.append(GpuProcess(pid=pid, gpu_index=index, used_mib=_number(row[2])))
    return found


def parse_keys(out: bytes) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in out.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            values[key] = value.strip()
    return values


def gpu_sample(ts: float, rc: int | None, lines: list[str], err: str, where: str,
               xids: XidCursor | None = None) -> GpuSample:
    """What the GPUS script printed (sections ``gpus``, ``apps``, ``health`` and ``xids``, each a
    line of its own then its rows) as one sample of ``where``; a failed or garbled run is an
    unavailable sample saying why.  ``xids``: the box's cursor in its kernel log (None: not read)."""
    if rc != 0 or "gpus" not in lines or "apps" not in lines:
        detail = " ".join(ln for ln in lines if ln not in _SECTIONS)[:300] or err.strip()[:300]
        return GpuSample(ts, False, f"nvidia-smi failed on {where}: {detail.strip()}", (), ())
    sections = _sections(lines)
    devices = parse_gpus(sections["gpus"])
    processes = parse_apps(sections["apps"], devices)
    health = parse_health(sections.get("health", []))
    devices = [replace(d, health=health[d.index][1], pci_bus_id=health[d.index][0]) if d.index in health else d
               for d in devices]
    found: tuple[XidEvent, ...] = ()
    rows = sections.get("xids")
    if xids is not None and rows is not None and _remote.XID_UNREADABLE not in rows:
        kernel = [x for row in rows if (x := parse_xid(row)) is not None]
        found = fold_xids(to_events(xids.new(kernel), {d.index: d.pci_bus_id for d in devices}))
    return GpuSample(ts, True, "", tuple(devices), tuple(processes), found)


_SECTIONS = ("gpus", "apps", "health", "xids")


def _sections(lines: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line in _SECTIONS and line not in found:
            current = found[line] = []
        elif current is not None:
            current.append(line)
    return found


def parse_health(lines: Iterable[str]) -> dict[int, tuple[str, DeviceHealth]]:
    """nvidia-smi's health query (7 columns, or the older 5) per GPU index: (PCI bus id, health)."""
    found: dict[int, tuple[str, DeviceHealth]] = {}
    for row in csv.reader(lines, skipinitialspace=True):
        if len(row) not in (5, 7) or (index := _number(row[0])) is None:
            continue
        retired = _yes_no(row[3])
        if len(row) == 7:
            remap_pending, remap_failed, reasons = _yes_no(row[4]), _yes_no(row[5]), row[6]
        else:
            remap_pending, remap_failed, reasons = None, None, row[4]
        pending = None if retired is None and remap_pending is None else bool(retired or remap_pending)
        found[index] = (row[1].strip(), DeviceHealth(ecc_uncorrected=_number(row[2]), pages_pending=pending,
                                                     remap_failed=remap_failed, throttle_reasons=_bitmask(reasons)))
    return found


def _yes_no(text: str) -> bool | None:
    return {"yes": True, "no": False}.get(text.strip().lower())  # "[N/A]", "[Not Supported]": unknown


def _bitmask(text: str) -> int | None:
    try:
        return int(text.strip(), 16)  # "0x0000000000000001"
    except ValueError:
        return None


def parse_exit_status(out: bytes, now: float) -> ExitStatus | None:
    """EXIT_STATUS_AGED's answer: None while the file is absent (or holds no number yet); its
    age, when given, dates the command's end on this machine's clock (``now`` minus the age)."""
    lines = out.decode(errors="replace").splitlines()
    if not lines or lines[0].strip() != "present" or len(lines) < 2:
        return None
    code = lines[1].strip()
    if not code.lstrip("-").isdigit():
        return None
    age = next((line.split()[1] for line in lines[2:] if line.startswith("age ") and len(line.split()) == 2), None)
    ended_at = now - max(0, int(age)) if age is not None and age.lstrip("-").isdigit() else None
    return ExitStatus.from_wrapper_code(int(code), ended_at=ended_at)


def parse_log_stat(out: bytes, now: float) -> LogStat | None:
    """LOG_STAT's answer: None when the log is absent (or the answer unreadable); its last change
    dated on this machine's clock (``now`` minus its age on the box's)."""
    words = out.decode(errors="replace").split()
    if len(words) != 4 or words[0] != "log" or not words[1].isdigit():
        return None
    try:
        modified, there = _seconds(words[2]), _seconds(words[3])
    except ValueError:
        return None
    return LogStat(int(words[1]), now - max(0.0, there - modified))


def _seconds(text: str) -> float:
    """A time stat or date printed: with a fraction, or whole seconds and a fraction they could not give."""
    try:
        return float(text)
    except ValueError:
        return float(text.partition(".")[0])
