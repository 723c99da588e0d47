"""Containment of local attempts: a cgroup v2 of their own where the machine allows it.

A process that clears its environment (no ``SUPERVISE_ATTEMPT`` tag) and calls ``setsid``
(another process group) escapes every other way of finding an attempt's processes; a cgroup
it cannot leave, as systemd does for a unit.  Where a writable cgroup v2 hierarchy with
``cgroup.kill`` (Linux >= 5.14) is mounted (as root, or in a delegated subtree), each local
attempt runs in ``<own cgroup>/supervise/<tag>``: the launch wrapper moves itself there
before it starts the command, so every descendant is born inside, and a stop ends them all
by writing ``cgroup.kill``.  Elsewhere the tag and the process group remain the only means
(``Containment.kind`` says which is in force; ``supervise doctor`` prints it).

Limits (a spec's `[limits]`, core/resource_limits.py) need more: the memory, cpu and pids controllers
enabled for the attempts' cgroups.  cgroup v2 enables a controller for a cgroup's children only where
that cgroup holds no process of its own, so under the daemon's own cgroup (which holds the daemon)
they are there only if someone enabled them above; the setting ``cgroup_root`` names a delegated
cgroup without processes (systemd's Delegate=yes, or one an administrator made) where the daemon
enables them itself.  ``Containment.controllers`` says which it got.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from supervisor.core.resource_limits import Controller, LimitHit, LimitKind, ResourceLimits, refusal
from supervisor.core.usage import AttemptUsage

CGROUP_VAR = "SUPERVISE_CGROUP"  # the attempt's cgroup, for the launch wrapper to enter
LIMITS_VAR = "SUPERVISE_LIMITS"  # set: the cgroup holds the spec's limits, and the command must not run outside it
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class ContainmentKind(StrEnum):
    CGROUP = "cgroup"  # every attempt in a cgroup of its own
    TAG = "tag"  # the environment tag and the process group only


@dataclass(frozen=True)
class Containment:
    kind: ContainmentKind
    reason: str  # what was found, in words
    root: Path | None = None  # where attempts' cgroups are made (kind CGROUP)
    # The controllers enabled for the attempts' cgroups (what `[limits]` can use), and why not the others.
    controllers: frozenset[Controller] = frozenset()
    controllers_note: str = ""

    def cgroup_of(self, tag: str) -> Path | None:
        """The cgroup of the attempt tagged ``tag`` (None without cgroup containment)."""
        return None if self.root is None else self.root / _UNSAFE.sub("_", tag)

    @property
    def limits_note(self) -> str:
        """Why some limits' controllers are missing here ("" when none is)."""
        return self.controllers_note if self.root is not None else self.reason

    def limits_refusal(self, limits: ResourceLimits) -> str | None:
        return refusal(limits, self.controllers, self.limits_note)


def detect(mounts: Path = Path("/proc/self/mounts"), own: Path = Path("/proc/self/cgroup"),
           base: Path | None = None) -> Containment:
    """Which containment this process can give its children, tried for real: a cgroup is made
    and removed under its own (or under ``base``, the setting cgroup_root), since permissions alone
    do not say (delegation, read-only mounts)."""
    mount = _cgroup2_mount(mounts)
    if mount is None:
        return Containment(ContainmentKind.TAG, "no cgroup v2 hierarchy is mounted: processes are found by tag and group")
    configured = base is not None
    if base is None:
        relative = _own_cgroup(own)
        if relative is None:
            return Containment(ContainmentKind.TAG, "this process has no cgroup v2 entry: processes are found by tag and group")
        base = mount / relative.lstrip("/")
    elif not (base / "cgroup.controllers").is_file():
        return Containment(ContainmentKind.TAG, f"cgroup_root {base} is not a cgroup v2 directory: processes are found "
                                                "by tag and group")
    root = base / "supervise"
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
    controllers, note = _enable_controllers(base, root, configured)
    return Containment(ContainmentKind.CGROUP, f"cgroup v2: every local attempt in its own cgroup under {root}", root,
                       controllers, note)


def _enable_controllers(base: Path, root: Path, configured: bool) -> tuple[frozenset[Controller], str]:
    """Enable the limits' controllers for ``root``'s children, and for ``root`` in ``base`` where
    ``base`` is the configured cgroup_root (the kernel allows it only where ``base`` holds no process;
    the daemon's own cgroup is never changed: it may be the machine's root, where the change would
    reach every service).  Returns those in force, and a note on the missing ones."""
    for parent in (base, root) if configured else (root,):
        available = _words(parent / "cgroup.controllers")
        for controller in Controller:
            if controller.value in available and controller.value not in _words(parent / "cgroup.subtree_control"):
                with contextlib.suppress(OSError):  # EBUSY: processes of its own; EACCES: not delegated
                    (parent / "cgroup.subtree_control").write_text(f"+{controller.value}")
    enabled = frozenset(c for c in Controller if c.value in _words(root / "cgroup.subtree_control"))
    missing = [c.value for c in Controller if c not in enabled]
    if not missing:
        return enabled, ""
    held = "holds processes of its own" if _words(base / "cgroup.procs") else "has no more delegated to it"
    offered = " ".join(sorted(_words(base / "cgroup.controllers"))) or "no controller"
    return enabled, f"{', '.join(missing)} not enabled for {root}: {base} offers {offered} and {held}"


def _words(file: Path) -> set[str]:
    try:
        return set(file.read_text().split())
    except OSError:
        return set()


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


def create(path: Path, limits: ResourceLimits | None = None) -> None:
    """Make the attempt's cgroup, with its limits written before anything enters it (OSError if
    a limit cannot be: an attempt never runs without the limits its spec asked for)."""
    path.mkdir(parents=False, exist_ok=True)
    if limits is None:
        return
    try:
        for name, value in limits.cgroup_files().items():
            file = path / name
            if not file.exists():  # the kernel makes a controller's files with the cgroup, or none
                if name == "memory.swap.max":
                    continue  # a kernel without swap accounting: memory.max alone bounds it
                raise FileNotFoundError(errno.ENOENT, f"no {name}: its controller is not enabled here", str(file))
            file.write_text(value)
    except OSError:
        remove(path)
        raise


def limit_hit(path: Path | None) -> LimitHit | None:
    """Whether the attempt's own limits ended it: its OOM killer at the cgroup's own memory.max
    (memory.events ``oom``, counted where the limit was reached, so a machine-wide OOM or a parent's
    limit is not taken for the job's), else a fork refused at pids.max (pids.events ``max``).
    The figures are read back from the cgroup, so they are the ones in force."""
    if path is None:
        return None
    memory_max = _number(path / "memory.max", 1)
    events = _events(path / "memory.events")
    if memory_max is not None and events.get("oom", 0) > 0:
        return LimitHit(LimitKind.MEMORY, memory_max, events.get("oom_kill", 0))
    pids_max = _number(path / "pids.max", 1)
    refused = _events(path / "pids.events").get("max", 0)
    if pids_max is not None and refused > 0:
        return LimitHit(LimitKind.TASKS, pids_max - 1, refused)  # the wrapper's shell is not the job's
    return None


def cpu_throttled_s(path: Path | None) -> float | None:
    """How long the cgroup's cpu.max held its processes back (cpu.stat ``throttled_usec``); None where
    it has no CPU limit (cpu.max "max ...") or no cpu controller."""
    if path is None:
        return None
    try:
        quota = (path / "cpu.max").read_text().split()[0]
    except (OSError, IndexError):
        return None
    throttled = _events(path / "cpu.stat").get("throttled_usec")
    return None if quota == "max" or throttled is None else throttled / 1e6


def _events(file: Path) -> dict[str, int]:
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return {}
    return {key: int(value) for key, _, value in (line.partition(" ") for line in lines) if value.strip().isdigit()}


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
