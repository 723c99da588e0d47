"""The local host: launch detached attempts, notice their exit at once, kill whole trees,
sample the GPUs (NVML, in a thread: its calls block briefly).

Exit is noticed through a pidfd (Linux >= 5.3): it becomes readable the moment the
wrapper ends, whoever its parent is, so a re-adopted attempt is watched as promptly as a
fresh one.  Where pidfd is missing, a short poll stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import structlog

from supervisor.core.errors import LaunchError
from supervisor.core.filemodes import job_umask
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.tasks import cancel_and_wait
from supervisor.core.usage import AttemptUsage
from supervisor.gpu.kernel_xids import KmsgReader
from supervisor.gpu.nvml import GpuSample, NvmlSampler
from supervisor.hosts import stacks
from supervisor.hosts.base import (
    ON_THIS_MACHINE,
    TAG_VAR,
    WRAPPER_SH,
    ExitStatus,
    Forewarning,
    KillReport,
    LaunchRequest,
    LogStat,
    ProcessHandle,
    log_paths,
    shown_command,
)
from supervisor.hosts.local import cgroup
from supervisor.hosts.local.cgroup import CGROUP_VAR, LIMITS_VAR, Containment
from supervisor.hosts.local.follow import LogFollower
from supervisor.hosts.local.rss import RssPeaks
from supervisor.hosts.stacks import StackDump

log = structlog.get_logger("supervise.launch")

_START_TIME_TOLERANCE_S = 0.05  # create_time comes from clock ticks; same process reads the same value


class LocalHost:
    name = LOCAL_HOST
    capabilities = ON_THIS_MACHINE

    def __init__(self, log_root: Path, *, poll_interval_s: float = 0.5, nvml: Any | None = None,
                 containment: Containment | None = None, kernel_log: str | None = None) -> None:
        """``nvml``: the ``pynvml`` module or a stand-in with its functions (None: pynvml).
        ``containment``: how attempts are contained (None: what this machine offers, see cgroup.py).
        ``kernel_log``: read for Xids where NVML's event set cannot report them (None: not read)."""
        self.log_root = log_root
        self.containment = containment if containment is not None else cgroup.detect()
        self.capabilities = replace(ON_THIS_MACHINE, cgroup_controllers=self.containment.controllers,
                                    cgroup_note=self.containment.limits_note)
        self.poll_interval_s = poll_interval_s
        self._gpus = NvmlSampler(nvml=nvml, kernel_log=None if kernel_log is None else KmsgReader(kernel_log))
        self._usage: dict[str, AttemptUsage] = {}  # by tag: read as each attempt's cgroup went, until asked
        self._rss = RssPeaks()  # peak memory where the cgroup does not count it

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        suffix = 0
        while Path(log_paths(self.log_root, job, attempt, suffix)[0]).exists():
            suffix += 1
        return log_paths(self.log_root, job, attempt, suffix)

    async def launch(self, request: LaunchRequest) -> ProcessHandle:
        env = {**os.environ, **request.env, TAG_VAR: request.tag}
        env.pop(CGROUP_VAR, None)
        env.pop(LIMITS_VAR, None)
        group = self._make_cgroup(request)
        if group is not None:
            env[CGROUP_VAR] = str(group)
            if request.limits is not None:
                env[LIMITS_VAR] = "1"
        Path(request.log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(request.status_path)  # a stale status must never be read as this attempt's
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", WRAPPER_SH, "supervise-wrapper",
                request.log_path, request.status_path, request.workdir, *request.argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                umask=job_umask(),  # the daemon's own is 077; the job gets the one it was started with
            )
            out, err = await proc.communicate()
        except OSError as exc:
            cgroup.remove(group)  # nothing entered it
            raise LaunchError(f"cannot start /bin/sh to launch {request.argv[0]}: {exc}") from exc
        pid_text = out.decode(errors="replace").strip()
        if proc.returncode != 0 or not pid_text.isdigit():
            cgroup.remove(group)  # a launch that never ran leaves no cgroup behind
            detail = err.decode(errors="replace").strip() or _tail(request.log_path)
            raise LaunchError(f"launch of {request.argv[0]} failed (wrapper exit {proc.returncode}): {detail}")
        pid = int(pid_text)
        await _wait_for_own_session(pid)
        return ProcessHandle(
            pid=pid, start_time=_start_time(pid), pgid=pid, tag=request.tag,
            log_path=request.log_path, status_path=request.status_path,
        )

    def _make_cgroup(self, request: LaunchRequest) -> Path | None:
        limits = request.limits
        refusal = None if limits is None else self.containment.limits_refusal(limits)
        if refusal is not None:  # checked at `start`; here for a relaunch by a daemon started elsewhere since
            raise LaunchError(refusal)
        group = self.containment.cgroup_of(request.tag)
        if group is None:
            return None
        try:
            cgroup.create(group, limits)
        except OSError as exc:  # e.g. the hierarchy was remounted read-only since start-up
            if limits is not None:  # never run without the limits the spec asked for
                raise LaunchError(f"cannot set the limits ({limits.describe()}) in {group}: {exc.strerror}") from exc
            log.warning("cannot make the attempt's cgroup; contained by tag and group only", cgroup=str(group),
                        error=exc.strerror)
            return None
        return group

    async def wait_exit(self, handle: ProcessHandle) -> ExitStatus:
        group = self.containment.cgroup_of(handle.tag)
        sampler = None
        if not cgroup.counts_memory(group):  # no memory.peak to read at the end: sampled meanwhile
            # Each sample looks at every process on the machine: one found without the attempt's tag is
            # not read again (its environment was fixed when it was started), by pid and start time.
            untagged: dict[int, float] = {}
            sampler = asyncio.create_task(self._rss.sample_until_cancelled(
                handle.tag, lambda: _attempt_processes(handle, group, untagged)), name=f"rss:{handle.tag}")
        try:
            await self._wait_gone(handle)
        finally:
            if sampler is not None:
                await cancel_and_wait(sampler)
        oom_kills = cgroup.oom_kills(group)  # read before the cgroup goes, with its memory.events
        hit = cgroup.limit_hit(group)
        throttled = cgroup.cpu_throttled_s(group)
        self._keep_usage(handle, cgroup.usage(group))
        cgroup.remove(group)  # only once empty: an escaped process keeps it
        status = await self.exit_status(handle)
        status = status if status is not None else ExitStatus(returncode=None, signal=None)
        status = replace(status, cpu_throttled_s=throttled)
        if hit is not None:
            return replace(status, limit_hit=hit)
        if oom_kills:
            return replace(status, kernel_oom=f"cgroup memory.events: oom_kill {oom_kills}")
        return status

    def _keep_usage(self, handle: ProcessHandle, usage: AttemptUsage | None) -> None:
        if usage is not None:
            self._usage[handle.tag] = usage

    async def program_pid(self, handle: ProcessHandle) -> int | None:
        """The wrapper's child: the program it runs (the wrapper stays to record its exit)."""
        if not _alive(handle):
            return None
        try:
            children = psutil.Process(handle.pid).children()
        except psutil.Error:
            return None
        return min((c.pid for c in children), default=None)

    async def forewarn(self, handle: ProcessHandle, signum: int, wait_s: float) -> Forewarning:
        """The program (the wrapper's child) alone gets the signal: its data-loader workers and
        helpers would mostly die of SIGUSR1's default action, and the wrapper must outlive it."""
        pid = await self.program_pid(handle)
        if pid is None:
            return Forewarning(pid=None, waited_s=0.0, ended=True)
        return await asyncio.to_thread(_forewarn, pid, signum, wait_s)

    async def attempt_usage(self, handle: ProcessHandle) -> AttemptUsage | None:
        """What the attempt used, from its cgroup: as read when it went, else now (it runs on)."""
        kept = self._usage.pop(handle.tag, None)
        used = kept if kept is not None else cgroup.usage(self.containment.cgroup_of(handle.tag))
        sampled = self._rss.take_mib(handle.tag)
        if sampled is None or (used is not None and used.peak_memory_mib is not None):
            return used
        return (used or AttemptUsage()).model_copy(update={"peak_memory_mib": sampled, "peak_memory_sampled": True})

    async def _wait_gone(self, handle: ProcessHandle) -> None:
        try:
            pidfd = os.pidfd_open(handle.pid)
        except ProcessLookupError:
            return
        except (AttributeError, OSError):
            while _alive(handle):  # noqa: ASYNC110 - no pidfd here (old kernel): nothing to await but time
                await asyncio.sleep(self.poll_interval_s)
            return
        try:
            if not _alive(handle):  # the pid was reused before we opened it
                return
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()

            def on_exit() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(pidfd, on_exit)
            try:
                await gone
            finally:
                loop.remove_reader(pidfd)
        finally:
            os.close(pidfd)

    async def is_alive(self, handle: ProcessHandle) -> bool:
        return _alive(handle)

    async def exit_status(self, handle: ProcessHandle) -> ExitStatus | None:
        try:
            with open(handle.status_path) as file:  # one open file: its mtime is this status's, not a newer one's
                text = file.read().strip()
                written = os.fstat(file.fileno()).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("exit status unreadable", path=handle.status_path, error=str(exc))
            return None
        return ExitStatus.from_wrapper_code(int(text), ended_at=written) if text.lstrip("-").isdigit() else None

    async def log_stat(self, path: str) -> LogStat | None:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return LogStat(info.st_size, info.st_mtime)

    async def attempt_pids(self, handle: ProcessHandle) -> set[int]:
        return {p.pid for p in _attempt_processes(handle, self.containment.cgroup_of(handle.tag))}

    async def dump_stacks(self, handle: ProcessHandle, timeout_s: float) -> StackDump:
        return await stacks.dump(await self.attempt_pids(handle), timeout_s)

    async def kill_tree(self, handle: ProcessHandle, grace_s: float) -> KillReport:
        report = await asyncio.to_thread(_kill_tree, handle, grace_s, self.containment.cgroup_of(handle.tag))
        self._keep_usage(handle, report.usage)
        return report

    def follow(self, path: str, offset: int, generation: int = 0) -> LogFollower:
        return LogFollower(Path(path), offset, generation, poll_interval=self.poll_interval_s)

    async def sample_gpus(self) -> GpuSample:
        return await asyncio.to_thread(self._gpus.sample)

    async def close(self) -> None:
        self._gpus.close()


async def _wait_for_own_session(pid: int, timeout_s: float = 5.0) -> None:
    """The wrapper prints its pid before its `setsid` has run: until then its process group is
    still the launching shell's, and signalling the attempt's group would miss it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return  # already over: wait_exit will read its status
        await asyncio.sleep(0.001)
    log.warning("wrapper did not start its own session in time", pid=pid)


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(handle: ProcessHandle) -> bool:
    try:
        proc = psutil.Process(handle.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except psutil.Error:
        return False
    if handle.start_time is None:
        return True
    return abs(created - handle.start_time) < _START_TIME_TOLERANCE_S


def _attempt_processes(handle: ProcessHandle, group: Path | None = None,
                       untagged: dict[int, float] | None = None) -> list[psutil.Process]:
    """Every live process of the attempt: the wrapper's group and tree, every process carrying
    the attempt's tag, which finds workers that escaped the group and were re-parented to init,
    and every process in the attempt's cgroup, which nothing escapes.  ``untagged``: processes
    (pid: start time) an earlier call of the same caller found without the tag, whose
    environment is not read again; those found now are added to it."""
    found: dict[int, psutil.Process] = {}
    for pid in cgroup.members(group):
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid)
    # Only a wrapper identified by pid *and* start time anchors a tree or a group: a bare or
    # reused pid (pid 1 above all) must never make init's tree look like the attempt's.
    anchored = handle.pid > 1 and handle.start_time is not None and _alive(handle)
    if anchored:
        wrapper = psutil.Process(handle.pid)
        found[wrapper.pid] = wrapper
        with contextlib.suppress(psutil.Error):
            for child in wrapper.children(recursive=True):
                found[child.pid] = child
    spared = _self_and_ancestors()
    wrapper_alive = handle.pid in found
    present: set[int] = set()
    for proc in psutil.process_iter(["pid"]):
        present.add(proc.pid)
        if proc.pid in found or proc.pid in spared:
            continue
        try:
            in_group = wrapper_alive and os.getpgid(proc.pid) == handle.pgid
            if not in_group and untagged is not None:
                started = proc.create_time()
                if untagged.get(proc.pid) == started:
                    continue
                if not _has_tag(proc, handle.tag):
                    untagged[proc.pid] = started
                    continue
            elif not (in_group or _has_tag(proc, handle.tag)):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc
        except (psutil.Error, OSError):
            continue
    if untagged is not None:  # kept to the processes there are
        for gone in [pid for pid in untagged if pid not in present]:
            del untagged[gone]
    return [p for p in found.values() if p.pid not in spared]


def _self_and_ancestors() -> set[int]:
    """The daemon and the processes above it: never part of an attempt, whatever a handle says."""
    pids = {0, 1, os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def _has_tag(proc: psutil.Process, tag: str) -> bool:
    try:
        return proc.environ().get(TAG_VAR) == tag
    except psutil.Error:
        return False


def _kill_tree(handle: ProcessHandle, grace_s: float, group: Path | None = None) -> KillReport:
    report = KillReport()
    targets = _attempt_processes(handle, group)
    names = {p.pid: _name(p) for p in targets}
    report.reparented = _reparented(handle, targets)
    _signal_all(handle, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = targets
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        # A dying parent may spawn or orphan more tagged processes: they get SIGTERM too.
        newcomers = [p for p in _attempt_processes(handle, group) if p.pid not in names]
        _signal_all(handle, newcomers, signal.SIGTERM)
        alive = _merge(alive, newcomers, names)
    report.terminated = [(pid, names[pid]) for pid in names if pid not in {p.pid for p in alive}]
    for _ in range(3):  # a few rounds: KILL, then catch anything that appeared meanwhile
        if not alive:
            break
        cgroup.kill(group)  # the whole cgroup at once: a process forking right now cannot slip out
        _signal_all(handle, alive, signal.SIGKILL)
        report.killed.extend((p.pid, names.get(p.pid, "?")) for p in alive)
        _, alive = psutil.wait_procs(alive, timeout=2.0)
        alive = _merge(alive, _attempt_processes(handle, group), names)
    report.survivors = [(p.pid, names.get(p.pid, "?")) for p in alive]
    if not alive:
        report.usage = cgroup.usage(group)
        cgroup.remove(group)
    return report


def _forewarn(pid: int, signum: int, wait_s: float) -> Forewarning:
    started = time.monotonic()
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signum)
        proc.wait(timeout=wait_s)  # a zombie counts as ended: its wrapper reaps it right after
    except psutil.TimeoutExpired:
        return Forewarning(pid=pid, waited_s=time.monotonic() - started, ended=False)
    except psutil.Error:
        pass  # it ended before the signal, or as it came
    return Forewarning(pid=pid, waited_s=time.monotonic() - started, ended=True)


def _reparented(handle: ProcessHandle, procs: list[psutil.Process]) -> list[int]:
    """The processes whose parent is outside the attempt: orphans adopted by init (or a
    subreaper) after their parent died.  The wrapper's own parent is outside by design."""
    pids = {p.pid for p in procs}
    orphans = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.pid != handle.pid and proc.ppid() not in pids:
                orphans.append(proc.pid)
    return sorted(orphans)


def _merge(alive: list[psutil.Process], more: list[psutil.Process], names: dict[int, str]) -> list[psutil.Process]:
    by_pid = {p.pid: p for p in alive}
    for proc in more:
        if proc.pid not in by_pid:
            names.setdefault(proc.pid, _name(proc))
            by_pid[proc.pid] = proc
    return [p for p in by_pid.values() if _running(p)]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_all(handle: ProcessHandle, procs: list[psutil.Process], sig: signal.Signals) -> None:
    """SIGTERM spares the wrapper, so that it outlives the command and records its exit
    status; SIGKILL goes to the whole group, wrapper included."""
    if sig == signal.SIGKILL and handle.pgid > 1 and handle.start_time is not None and _alive(handle):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pgid, sig)
    for proc in procs:
        if sig != signal.SIGKILL and proc.pid == handle.pid:
            continue
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
            if sig == signal.SIGTERM:
                # A stopped process (SIGSTOP, Ctrl-Z, a debugger) cannot act on SIGTERM until it
                # runs again; systemd sends SIGCONT after SIGTERM for the same reason.
                proc.send_signal(signal.SIGCONT)


def _name(proc: psutil.Process) -> str:
    try:
        return shown_command(proc.cmdline())[:120] or proc.name()
    except psutil.Error:
        return "?"


def _tail(path: str, limit: int = 300) -> str:
    try:
        data = Path(path).read_bytes()[-limit:]
    except OSError:
        return "(no log)"
    return data.decode(errors="replace").strip().replace("\n", " | ")
