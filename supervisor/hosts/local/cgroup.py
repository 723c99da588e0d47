"""Containment of local attempts: a cgroup v2 of their own where the machine allows it.

A process that clears its environment (no ``SUPERVISE_ATTEMPT`` tag) and calls ``setsid``
(another process group) escapes every other way of finding an attempt's processes; a cgroup
it cannot leave, as systemd does for a unit.  Where a writable cgroup v2 hierarchy with
``cgroup.kill`` (Linux >= 5.14) is mounted (as root, or in a delegated subtree), each local
attempt runs in ``<own cgroup>/supervise/<tag>``: the launch wrapper moves itself there
before it starts the command, so every descendant is born inside, and a stop ends them all
by writing ``cgroup.kill``.  Elsewhere the tag and the process group remain the only means
(``Containment.kind`` says which is in force; ``supervise doctor`` prints it).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from supervisor.core.usage import AttemptUsage

CGROUP_VAR = "SUPERVISE_CGROUP"  # the attempt's cgroup, for the launch wrapper to enter
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class ContainmentKind(StrEnum):
    CGROUP = "cgroup"  # every attempt in a cgroup of its own
    TAG = "tag"  # the environment tag and the process group only


@dataclass(frozen=True)
class Containment:
    kind: ContainmentKind
    reason: str  # what was found, in words
    root: Path | None = None  # where attempts' cgroups are made (kind CGROUP)

    def cgroup_of(self, tag: str) -> Path | None:
        """The cgroup of the attempt tagged ``tag`` (None without cgroup containment)."""
        return None if self.root is None else self.root / _UNSAFE.sub("_", tag)


def detect(mounts: Path = Path("/proc/self/mounts"), own: Path = Path("/proc/self/cgroup")) -> Containment:
    """Which containment this process can give its children, tried for real: a cgroup is made
    and removed under its own, since permissions alone do not say (delegation, read-only mounts)."""
    mount = _cgroup2_mount(mounts)
    if mount is None:
        return Containment(ContainmentKind.TAG, "no cgroup v2 hierarchy is mounted: processes are found by tag and group")
    relative = _own_cgroup(own)
    if relative is None:
        return Containment(ContainmentKind.TAG, "this process has no cgroup v2 entry: processes are found by tag and group")
    root = mount / relative.lstrip("/") / "supervise"
    probe = root / f"probe-{os.getpid()}"
    try:
        root.mkdir(exist_ok=True)
        probe.mkdir(exist_ok=True)
        has_kill = (probe / "cgroup.kill").exists()
        probe.rmdir()
    except OSError as exc:
        return Containment(ContainmentKind.TAG, f"cgroup v2 at {mount} is not writable here ({exc.strerror}): "
                                                "processes are found by tag and group")
    if not has_kill:
        return Containment(ContainmentKind.TAG, "this kernel has no cgroup.kill (Linux < 5.14): processes are found "
                                                "by tag and group")
    sweep(root)
    return Containment(ContainmentKind.CGROUP, f"cgroup v2: every local attempt in its own cgroup under {root}", root)


# An attempt's cgroup is made a moment before its wrapper enters it: one younger than this may be
# another daemon's launch under way (daemons of one user share the root), and is left alone.
_SWEEP_AFTER_S = 60.0


def sweep(root: Path, older_than_s: float = _SWEEP_AFTER_S) -> int:
    """Remove the empty attempt cgroups left under ``root`` (attempts that ended while no daemon
    watched, launches that failed); a cgroup with a live member is kept (rmdir refuses it).
    Returns how many went."""
    removed = 0
    now = time.time()
    with contextlib.suppress(OSError):
        for group in root.iterdir():
            if not group.is_dir() or group.name.startswith("probe-"):
                continue
            try:
                if now - group.stat().st_mtime < older_than_s:
                    continue
                group.rmdir()
                removed += 1
            except OSError:
                continue  # live members, or gone meanwhile
    return removed


def _cgroup2_mount(mounts: Path) -> Path | None:
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1].replace("\\040", " "))
    return None


def _own_cgroup(own: Path) -> str | None:
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


def create(path: Path) -> None:
    path.mkdir(parents=False, exist_ok=True)


def members(path: Path | None) -> set[int]:
    """The pids in the cgroup now (none when it does not exist)."""
    if path is None:
        return set()
    try:
        return {int(pid) for pid in (path / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def oom_kills(path: Path | None) -> int:
    """How many of the cgroup's processes the kernel's OOM killer ended (memory.events'
    ``oom_kill``; 0 without the memory controller or the cgroup)."""
    if path is None:
        return 0
    try:
        lines = (path / "memory.events").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def counts_memory(path: Path | None) -> bool:
    """Whether the cgroup keeps its peak memory (``memory.peak``: the memory controller reaches it)."""
    return path is not None and (path / "memory.peak").is_file()


def usage(path: Path | None) -> AttemptUsage | None:
    """CPU seconds, peak memory and peak tasks of the cgroup (each None where the kernel or its
    controllers do not keep it); None without the cgroup."""
    if path is None:
        return None
    try:
        stat = dict(line.split(" ", 1) for line in (path / "cpu.stat").read_text().splitlines() if " " in line)
    except OSError:
        return None
    usec = stat.get("usage_usec", "").strip()
    return AttemptUsage(cpu_s=int(usec) / 1e6 if usec.isdigit() else None,
                        peak_memory_mib=_number(path / "memory.peak", 1024 * 1024),
                        peak_tasks=_number(path / "pids.peak", 1))


def _number(file: Path, unit: int) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    return int(text) // unit if text.isdigit() else None


def kill(path: Path | None) -> None:
    """SIGKILL every process in the cgroup and its descendants, atomically (no fork escapes)."""
    if path is not None:
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")


def remove(path: Path | None) -> None:
    """Remove the cgroup once empty (a live member keeps it, and it is tried again later)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.rmdir()
