"""What a runner waits for outside an attempt's watch, each said as the job's state while it
lasts: the jobs its spec runs `after`, a host that cannot be reached, GPU memory other processes
hold (``GpuGate``), and the GPUs and hosts kept away from (``KeepAway``).  Each part below keeps
the note it had as a module of its own.

A runner's wait for the jobs its spec runs `after` (supervisor/jobs/dependencies.py): `waiting`
with the reason while they run, `cancelled` with an alert when one gave up."""

from __future__ import annotations

import asyncio
import time
from itertools import groupby

import structlog

from supervisor.core.errors import ConnectionLost, HostRefused
from supervisor.core.events import EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, AlertData, GpuHolder, GpuWaitData
from supervisor.core.tasks import set_within
from supervisor.gpu.nvml import GpuProcess, GpuSample, foreign_processes
from supervisor.hosts.base import Host
from supervisor.hosts.reach import refuse_if_nothing_listens
from supervisor.jobs.dependencies import readiness
from supervisor.jobs.quarantine import UNREACHABLE as UNREACHABLE_STRIKE
from supervisor.jobs.quarantine import Quarantines
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live, RunnerContext, cmdline
from supervisor.jobs.runner._journal import Journal
from supervisor.notify import notices
from supervisor.notify.alerts import Alert, Alerter
from supervisor.spec.model import JobSpec
from supervisor.store.database import Store
from supervisor.store.quarantine import Quarantine

POLL_S = 0.25  # the store is read, so a restarted daemon's runner asks the same question


async def wait_for_after(after: list[str], store: Store, journal: Journal, alerter: Alerter, stop: asyncio.Event) -> bool:
    """True once every job in ``after`` is done; False when cancelled or stopped (the job's state says which)."""
    shown = ""
    while True:
        state = readiness(store, after)
        if state.ready:
            return True
        if state.cancelled is not None:
            await _cancel(journal, alerter, state.cancelled)
            return False
        if state.waiting != shown:
            shown = state.waiting
            journal.set_job(JobState.WAITING, shown)
        if not await set_within(stop, POLL_S):
            continue
        journal.set_job(JobState.STOPPED, f"stopped by user while {shown}")
        return False


async def _cancel(journal: Journal, alerter: Alerter, why: str) -> None:
    name = journal.job
    reason = f"not launched: {why}"
    journal.set_job(JobState.CANCELLED, reason)
    # Attempt 0: nothing was launched; the event is kept (and shown by `events`) whether or not an
    # alert URL is configured.
    journal.record(0, EventKind.ALERT, f"{name}: cancelled", AlertData(evidence=reason, next="not launched"))
    await alerter.send(Alert(job=name, attempt=0, title=f"{name}: cancelled", what="cancelled", evidence=reason,
                             gpu="", next_action="not launched; start it again once the cause is fixed",
                             key=f"{name}:cancelled:{time.time():.0f}"))


# An attempt whose host cannot be reached: a host that cannot be reached (a link down past its
# retries, a changed host key, a refused login) says nothing of the process running there, so its
# attempt waits for the host, not ended.  The job reads ``unreachable`` (alerted), and the host is
# asked again, with backoff, until it answers (the runner then re-adopts the attempt) or the user
# stops the job.

UNREACHABLE = (ConnectionLost, HostRefused)
_REACH_AGAIN_S = (2.0, 30.0)  # the first wait before asking the host again, and the longest


async def wait_for_host(host: Host, live: Live, exc: Exception, journal: Journal, alerts: Alerts,
                        stopped: asyncio.Event) -> bool:
    """True once ``host`` answers again about ``live``'s process; False when ``stopped`` came first."""
    n, where = live.row.n, host.name
    journal.action(n, f"{where} unreachable: {exc}; attempt {n} is not known to have ended, waiting for the host",
                   ActionData(error=str(exc)))
    journal.set_job(JobState.UNREACHABLE, f"attempt {n}: {exc}; re-adopted when the host answers")
    alerts.send_soon(live, notices.unreachable(alerts.about(live), where, str(exc)))
    wait, said = _REACH_AGAIN_S[0], str(exc)
    while True:
        if await set_within(stopped, wait):
            # The attempt stays `running` in the store (nothing says it ended): a later `stop`,
            # once the host answers, finds it and kills it; a restarted daemon re-adopts it.
            journal.set_job(JobState.STOPPED, f"stopped by user while {where} was unreachable: attempt {n} "
                                              f"(pid {live.row.pid}) may still run there; `supervise stop {journal.job}` "
                                              "again once the host answers ends it")
            return False
        try:
            await host.is_alive(live.handle)
            return True
        except UNREACHABLE as again:
            wait = min(wait * 2, _REACH_AGAIN_S[1])
            if str(again) != said:  # a different refusal (the key fixed, the login not yet): say it
                said = str(again)
                journal.set_job(JobState.UNREACHABLE, f"attempt {n}: {again}; re-adopted when the host answers")


# Before a launch: GPU memory that other processes hold on the job's devices.
#
# ``gpu.foreign_memory`` says what to do: ``ignore`` them, ``refuse`` to launch, or ``wait`` (up
# to ``foreign_wait_s``) for them to let go.  A wait is said at once, whose memory it waits for
# (``gpu_wait``: what `start` answers; the job's reason; a ``gpu_wait`` event with the holders),
# and its end is noticed from the host's GPU samples, which the daemon takes on a steady interval
# anyway (``gpu_interval_s``): the sample that shows the memory gone wakes the launch, no timer.

log = structlog.get_logger("supervise.runner")


def holders_line(foreign: list[GpuProcess]) -> str:
    """'GPU 0: pid 1234 (python train.py) holds 40,960 MiB; GPU 1: …'"""
    by_gpu = groupby(sorted(foreign, key=lambda p: (p.gpu_index, p.pid)), key=lambda p: p.gpu_index)
    return "; ".join(f"GPU {gpu}: " + ", ".join(
        f"pid {p.pid} ({cmdline(p.pid)}) holds {'an unknown amount of' if p.used_mib is None else f'{p.used_mib:,}'} MiB"
        for p in procs) for gpu, procs in by_gpu)


class GpuGate:
    """The pre-launch check of a job runner, composed into it: ``clear()`` before each launch."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, stopped: asyncio.Event) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._stopped = stopped  # the runner's stop: ends the wait
        self.waiting: str | None = None  # while the launch waits for GPUs: for what, in one line

    async def clear(self) -> bool:
        """True: launch now.  False: not at all (refused, waited too long, or stopped); the job's
        state says why."""
        gpu = self._spec.gpu
        if gpu.foreign_memory == "ignore":
            return True
        devices = None if gpu.devices == "all" else list(gpu.devices)
        started = time.monotonic()
        deadline = started + gpu.foreign_wait_s
        said: frozenset[tuple[int, int]] = frozenset()
        sample = await self._ctx.gpu.sample()
        try:
            while True:
                foreign = foreign_processes(sample, devices, set()) if sample.available else []
                if not foreign:
                    if said:
                        self._gpus_free(sample, time.monotonic() - started)
                    return True
                who = holders_line(foreign)
                if gpu.foreign_memory == "refuse" or time.monotonic() >= deadline:
                    self._journal.set_job(JobState.FAILED, f"GPUs hold memory of other processes: {who}; "
                                                   "free them or set gpu.foreign_memory='ignore'")
                    return False
                holders = frozenset((p.pid, p.gpu_index) for p in foreign)
                if holders != said:  # said once per set of holders, not once per sample
                    said = holders
                    self._gpu_waiting(foreign, who, gpu.foreign_wait_s - (time.monotonic() - started))
                next_sample = await self._next_sample_unless_stopped(deadline)
                if next_sample is None:
                    self._journal.set_job(JobState.STOPPED, "stopped by user while waiting for GPUs")
                    return False
                sample = next_sample
        finally:
            self.waiting = None

    def _gpu_waiting(self, foreign: list[GpuProcess], who: str, left_s: float) -> None:
        self.waiting = f"waiting for {who}"
        n = self._ctx.store.next_attempt_number(self._spec.name)  # the attempt that waits to launch
        holders = tuple(GpuHolder(p.pid, p.gpu_index, p.used_mib, cmdline(p.pid)) for p in foreign)
        self._journal.record(n, EventKind.GPU_WAIT, f"{self.waiting} (launching when it is freed, "
                             f"for at most {left_s:.0f}s more)", GpuWaitData(holders))
        self._journal.set_job(JobState.WAITING, self.waiting)

    def _gpus_free(self, sample: GpuSample, waited_s: float) -> None:
        """The wait is over: said with the sample that showed it (when, and that it woke the launch)."""
        n = self._ctx.store.next_attempt_number(self._spec.name)
        at = time.strftime("%H:%M:%S", time.localtime(sample.ts)) + f".{int(sample.ts * 1000) % 1000:03d}"
        log.info("GPUs free: launching", job=self._spec.name, waited_s=round(waited_s, 2), woken_by="gpu sample",
                 sample_ts=sample.ts)
        self._journal.record(n, EventKind.ACTION, f"GPUs free (the GPU sample of {at} shows it): launching "
                             f"after waiting {waited_s:.1f}s",
                             ActionData(woken_by="gpu_sample", sample_ts=sample.ts, waited_s=waited_s))

    async def _next_sample_unless_stopped(self, deadline: float) -> GpuSample | None:
        """The host's next GPU sample (its sampling loop wakes us); None when a stop came first.
        At the deadline, a sample taken then."""
        sample = asyncio.ensure_future(self._ctx.gpu.next_sample())
        stop = asyncio.ensure_future(self._stopped.wait())
        try:
            done, _ = await asyncio.wait({sample, stop}, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sample, stop):
                task.cancel()
        if stop in done:
            return None
        if sample in done:
            return sample.result()
        return await self._ctx.gpu.sample()


# Before a launch: keeping the attempt away from quarantined GPUs and hosts (jobs/quarantine.py).
#
# - A job with a host pool (`hosts` with one shard) launches on its current host unless that is
#   quarantined, or the last attempt there ended with a host-level verdict (`killed`, the host
#   unreachable): then it moves to the next healthy host of the pool, in the pool's order, and says
#   so (an action event, and the job's reason).  With no healthy host left it stays where it is.
# - A job with `gpu.devices = "all"` is launched with CUDA_VISIBLE_DEVICES listing the host's GPUs
#   but the quarantined ones (the GPU count from the host's latest GPU sample), unless its `env`
#   sets CUDA_VISIBLE_DEVICES itself.
# - A job that names a quarantined GPU in `gpu.devices` waits until the quarantine ends or is
#   cleared (`waiting`, said at once by `start`): it asked for that board, and another would not be
#   what it asked for.  So does a `devices = "all"` job when every GPU of its host is quarantined.

_RECHECK_S = 1.0  # a wait on a quarantined GPU looks again this often (a `--clear` ends it)
HOST_VERDICTS = frozenset({Verdict.KILLED.value, UNREACHABLE_STRIKE})


def first_healthy(spec: JobSpec, quarantines: Quarantines | None) -> str:
    """Where a job starts: its `host`, or the first host of its pool that is not quarantined (the
    pool's first when every one is)."""
    if not is_pool(spec):
        return spec.host
    healthy = [h for h in spec.hosts if quarantines is None or quarantines.host(h) is None]
    return (healthy or spec.hosts)[0]


def is_pool(spec: JobSpec) -> bool:
    """`hosts` with one shard: a pool to choose from (with shards, each shard's host)."""
    return spec.shards == 1 and bool(spec.hosts)


def until_text(until: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(until))


class KeepAway:
    """The runner's pre-launch placement, composed into it: ``spec_for_launch()`` before each launch,
    ``attempt_ended()`` after each end."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, stopped: asyncio.Event) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._stopped = stopped
        self._leave: str | None = None  # why the next launch leaves the current host (a host-level verdict)
        self.waiting: str | None = None  # while the launch waits for a quarantined GPU: for what
        self._placed = False  # whether an attempt of this runner was placed (or re-adopted where it ran)

    async def attempt_ended(self, verdict: str, host: str | None = None) -> None:
        """An attempt on the current host ended with ``verdict`` (or the host became unreachable)."""
        quarantines = self._ctx.quarantines
        self._placed = True  # the next launch moves on from here, or stays
        where = host or self._ctx.host.name
        if quarantines is not None:
            await quarantines.attempt_ended(where, Verdict(verdict) if verdict != UNREACHABLE_STRIKE else UNREACHABLE_STRIKE)
        if verdict in HOST_VERDICTS and is_pool(self._spec):
            self._leave = ("the last attempt there was killed (a SIGKILL nobody here sent)" if verdict == Verdict.KILLED
                           else f"{where} did not answer")

    async def spec_for_launch(self) -> JobSpec | None:
        """The spec the next attempt launches with; None: stopped while waiting."""
        quarantines = self._ctx.quarantines
        if quarantines is None:
            return self._spec
        if is_pool(self._spec):
            self._move(quarantines)
            await self._pass_over_refusing(quarantines)
        if not await self._pinned_clear(quarantines):
            return None
        return self._without_quarantined(quarantines)

    def _move(self, quarantines: Quarantines) -> None:
        here = self._ctx.host.name
        if not self._placed:  # the run's first launch: the pool's first healthy host
            self._placed = True
            self._go(first_healthy(self._spec, quarantines))
            return
        held = quarantines.host(here)
        why = self._leave or (f"{here} is quarantined until {until_text(held.until)} ({held.reason})" if held else None)
        self._leave = None
        if why is None:
            return
        target = self._next_healthy(here, quarantines)
        if target is None:
            return  # nowhere healthy: stays (a quarantine of every host must not stop the job)
        self._go(target)
        n = self._ctx.store.next_attempt_number(self._spec.name)
        self._journal.action(n, f"moved from {here} to {target}: {why}",
                             ActionData(moved_from=here, moved_to=target, until=held.until if held else None))

    async def _pass_over_refusing(self, quarantines: Quarantines) -> None:
        """A pool host where nothing listens (a refused connection, known in a moment) is a strike
        and passed over for the next healthy one; a host that is slow to answer is left to the
        connection's own retries (it may be rebooting)."""
        for _ in self._spec.hosts:
            here = self._ctx.host.name
            try:
                await refuse_if_nothing_listens(here)
                return
            except ConnectionLost as exc:
                await quarantines.attempt_ended(here, UNREACHABLE_STRIKE)
                target = self._next_healthy(here, quarantines)
                if target is None:
                    return
                self._go(target)
                n = self._ctx.store.next_attempt_number(self._spec.name)
                self._journal.action(n, f"moved from {here} to {target}: {exc}",
                                     ActionData(moved_from=here, moved_to=target))

    def move_note(self) -> str:
        """What the alert of an ended attempt adds when the relaunch will move: '; moving from A to
        B (why)'; '' when it stays."""
        quarantines, here = self._ctx.quarantines, self._ctx.host.name
        if self._leave is None or quarantines is None or not is_pool(self._spec):
            return ""
        target = self._next_healthy(here, quarantines)
        return "" if target is None else f"; moving from {here} to {target} ({self._leave})"

    def _next_healthy(self, here: str, quarantines: Quarantines) -> str | None:
        """The pool's next host after ``here``, in the pool's order, that is not quarantined."""
        pool = list(self._spec.hosts)
        start = pool.index(here) + 1 if here in pool else 0
        others = [pool[(start + i) % len(pool)] for i in range(len(pool))]
        return next((h for h in others if h != here and quarantines.host(h) is None), None)

    def _go(self, target: str) -> None:
        if self._ctx.context_for is None or target == self._ctx.host.name:
            return
        other = self._ctx.context_for(target)
        # In place: the runner's collaborators (alerts, gates, ending) share this context.
        self._ctx.host, self._ctx.gpu, self._ctx.notify_dir = other.host, other.gpu, other.notify_dir

    def _blocking(self, quarantines: Quarantines) -> dict[int, Quarantine]:
        """The quarantined GPUs the launch must wait for: those `gpu.devices` names, or with
        `devices = "all"` every GPU of the host when all of them are (an empty CUDA_VISIBLE_DEVICES
        would run the job on none)."""
        bad = quarantines.gpus(self._ctx.host.name)
        devices = self._spec.gpu.devices
        if devices != "all":
            return {gpu: q for gpu, q in bad.items() if gpu in devices}
        sample = self._ctx.gpu.latest()
        if sample is None or not sample.available or not sample.devices or "CUDA_VISIBLE_DEVICES" in self._spec.env:
            return {}
        if all(d.index in bad for d in sample.devices):
            return {d.index: bad[d.index] for d in sample.devices}
        return {}

    async def _pinned_clear(self, quarantines: Quarantines) -> bool:
        said: tuple[int, ...] = ()
        try:
            while True:
                pinned = self._blocking(quarantines)
                if not pinned:
                    return True
                if tuple(sorted(pinned)) != said:
                    said = tuple(sorted(pinned))
                    self._say_waiting(pinned)
                if await set_within(self._stopped, _RECHECK_S):
                    self._journal.set_job(JobState.STOPPED, "stopped by user while waiting for a quarantined GPU")
                    return False
        finally:
            self.waiting = None

    def _say_waiting(self, pinned: dict[int, Quarantine]) -> None:
        host = self._ctx.host.name
        self.waiting = "waiting for " + "; ".join(
            f"GPU {gpu} quarantined until {until_text(q.until)} ({q.reason})" for gpu, q in sorted(pinned.items())
        ) + (f" (gpu.devices names it; `supervise quarantine --clear {host}:{min(pinned)}` launches now)"
             if self._spec.gpu.devices != "all" else
             f" (every GPU of {host} is; `supervise quarantine --clear {host}` launches now)")
        n = self._ctx.store.next_attempt_number(self._spec.name)
        self._journal.action(n, self.waiting, ActionData(left_out=sorted(pinned),
                                                         until=max(q.until for q in pinned.values())))
        self._journal.set_job(JobState.WAITING, self.waiting)

    def _without_quarantined(self, quarantines: Quarantines) -> JobSpec:
        spec = self._spec
        bad = quarantines.gpus(self._ctx.host.name)
        if spec.gpu.devices != "all" or not bad or "CUDA_VISIBLE_DEVICES" in spec.env:
            return spec
        sample = self._ctx.gpu.latest()
        if sample is None or not sample.available:
            return spec  # the GPUs are not known: CUDA's own default stands
        visible = [d.index for d in sample.devices if d.index not in bad]
        left_out = sorted(set(bad) & {d.index for d in sample.devices})
        if not left_out:
            return spec
        # NVML numbers devices in PCI bus order; CUDA's own default order may differ.
        env = {**spec.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, visible)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        n = self._ctx.store.next_attempt_number(spec.name)
        why = "; ".join(f"GPU {gpu} quarantined until {until_text(bad[gpu].until)} ({bad[gpu].reason})"
                        for gpu in left_out)
        self._journal.action(n, f"launching without GPU {', '.join(map(str, left_out))}: {why}; "
                                f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}",
                             ActionData(left_out=left_out, until=max(bad[g].until for g in left_out)))
        return spec.model_copy(update={"env": env})
