"""The output folder's free space while an attempt runs (``[disk]``, spec/disk.py): read every
``every_s`` with statvfs in a thread (a hung network file system blocks the thread, never the
loop), warned of under ``warn_free_mib``, and under ``min_free_mib`` the attempt is held or stopped.

Hold is SIGSTOP to every process of the attempt and the kill gate held with it (a frozen job
prints nothing, and must not be judged stalled for it); both undone when the free space is back
over ``min_free_mib`` (SIGCONT, and the gate released unless the user had held it).  Stop is
`supervise stop`'s: the program's first signal and grace if the spec has one (its checkpoint,
now while it still fits), TERM, KILL, and no relaunch: a relaunch would fill the same disk.

This machine's attempts only: a remote host's folder is not on this machine's file systems."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.errors import SuperviseError
from supervisor.core.events import EventKind
from supervisor.core.host_url import is_local
from supervisor.core.payloads import ActionData, DiskLowData
from supervisor.core.tasks import cancel_and_wait
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._journal import Journal
from supervisor.jobs.runner._verdict import Verdicts
from supervisor.notify import notices
from supervisor.spec.model import JobSpec

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Space:
    path: str  # the folder read, or the nearest existing folder above it
    free_mib: int  # free to the job's user (statvfs f_bavail)
    total_mib: int


def read_space(folder: str) -> Space:
    """The free space where ``folder`` is, or will be: a folder not made yet is on its parent's disk."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return Space(str(path), st.f_bavail * st.f_frsize // MIB, st.f_blocks * st.f_frsize // MIB)


class DiskWatch:
    def __init__(self, live: Live, *, spec: JobSpec, ctx: RunnerContext, journal: Journal, alerts: Alerts,
                 verdicts: Verdicts, stopped: asyncio.Event) -> None:
        self._live = live
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts
        self._verdicts = verdicts  # its hold of the kill gate, and its stop's kill
        self._stopped = stopped
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self._held: set[int] = set()  # the pids it stopped (SIGSTOP), to continue
        self._gate_held = False  # whether it held the kill gate itself (not the user)

    def start(self) -> None:
        disk = self._spec.disk
        if not is_local(self._live.row.host) or (not disk.warn_free_mib and disk.min_free_mib is None):
            return
        try:
            folder = self._spec.disk_folder()
        except SuperviseError:
            return  # its templates were checked at start: nothing to watch if they no longer expand
        self._task = asyncio.create_task(self._watch(folder), name=f"disk:{self._live.row.tag}")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._held:
            await self._resume(None)

    async def _watch(self, folder: str) -> None:
        every = self._spec.disk.every_s
        while True:
            try:
                space = await asyncio.to_thread(read_space, folder)
            except OSError:
                space = None  # unreadable now (a file system gone): read again next time
            if space is not None and await self._judge(space):
                return
            await asyncio.sleep(every)

    async def _judge(self, space: Space) -> bool:
        """What ``space`` calls for; True once the attempt is being stopped (nothing more to watch)."""
        disk, live = self._spec.disk, self._live
        low = disk.min_free_mib is not None and space.free_mib < disk.min_free_mib
        if low and disk.on_low == "stop":
            await self._stop(space)
            return True
        if low and not self._held:
            await self._hold(space)
        elif self._held and disk.min_free_mib is not None and space.free_mib >= disk.min_free_mib:
            await self._resume(space)
        if disk.warn_free_mib and space.free_mib < disk.warn_free_mib and not self._warned and not low:
            self._warned = True
            said = (f"disk low: {space.free_mib} MiB free of {space.total_mib} MiB at {space.path} "
                    f"(warn_free_mib {disk.warn_free_mib})")
            after = (f"{disk.on_low} under min_free_mib {disk.min_free_mib}" if disk.min_free_mib is not None
                     else "nothing: a warning")
            self._record(space, "warned", said)
            self._alerts.send_soon(live, notices.disk_low(self._alerts.about(live), said, "warned",
                                                          f"free space under {space.path}; {after}"))
        elif space.free_mib >= disk.warn_free_mib:
            self._warned = False  # warned again if it falls again
        return False

    def _record(self, space: Space, action: str, said: str) -> None:
        disk = self._spec.disk
        self._journal.record(self._live.row.n, EventKind.DISK_LOW, said,
                             DiskLowData(space.path, space.free_mib, space.total_mib, disk.warn_free_mib,
                                         disk.min_free_mib, action))

    async def _stop(self, space: Space) -> None:
        live, disk = self._live, self._spec.disk
        said = (f"disk low: {space.free_mib} MiB free at {space.path}, under min_free_mib {disk.min_free_mib}: "
                "stopping the job")
        self._record(space, "stopped", said)
        self._alerts.send_soon(live, notices.disk_low(self._alerts.about(live), said, "stopped",
                                                      f"free space under {space.path}, then `supervise start "
                                                      f"{self._spec.name}`"))
        self._stopped.set()  # the exit that follows is a stop, not a verdict: no relaunch
        await self._verdicts.kill(live, self._spec.stop_grace_s)

    async def _hold(self, space: Space) -> None:
        live, disk = self._live, self._spec.disk
        try:
            pids = {live.handle.pid} | await self._ctx.host.attempt_pids(live.handle)
        except SuperviseError:
            pids = {live.handle.pid}
        self._held = {pid for pid in sorted(pids) if _signal(pid, signal.SIGSTOP)}
        self._gate_held = not self._verdicts.held
        if self._gate_held:
            self._verdicts.hold(live)
        said = (f"disk low: {space.free_mib} MiB free at {space.path}, under min_free_mib {disk.min_free_mib}: "
                f"{len(self._held)} processes held (SIGSTOP) until it is over again")
        self._record(space, "held", said)
        self._alerts.send_soon(live, notices.disk_low(self._alerts.about(live), said, "held",
                                                      f"free space under {space.path}: it goes on by itself"))

    async def _resume(self, space: Space | None) -> None:
        live = self._live
        for pid in sorted(self._held):
            _signal(pid, signal.SIGCONT)
        count, self._held = len(self._held), set()
        if self._gate_held:
            self._gate_held = False
            self._verdicts.release(live)
        if space is not None:
            self._journal.action(live.row.n, f"disk space back: {space.free_mib} MiB free at {space.path}; "
                                 f"{count} processes continued (SIGCONT)", ActionData())


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except OSError:  # ended meanwhile
        return False
    return True
