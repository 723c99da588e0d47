"""Before a launch: keeping the attempt away from quarantined GPUs and hosts (jobs/quarantine.py).

- A job with a host pool (`hosts` with one shard) launches on its current host unless that is
  quarantined, or the last attempt there ended with a host-level verdict (`killed`, the host
  unreachable): then it moves to the next healthy host of the pool, in the pool's order, and says
  so (an action event, and the job's reason).  With no healthy host left it stays where it is.
- A job with `gpu.devices = "all"` is launched with CUDA_VISIBLE_DEVICES listing the host's GPUs
  but the quarantined ones (the GPU count from the host's latest GPU sample), unless its `env`
  sets CUDA_VISIBLE_DEVICES itself.
- A job that names a quarantined GPU in `gpu.devices` waits until the quarantine ends or is
  cleared (`waiting`, said at once by `start`): it asked for that board, and another would not be
  what it asked for.  So does a `devices = "all"` job when every GPU of its host is quarantined.
"""

from __future__ import annotations

import asyncio
import time

from supervisor.core.errors import ConnectionLost
from supervisor.core.events import JobState, Verdict
from supervisor.core.payloads import ActionData
from supervisor.core.tasks import set_within
from supervisor.hosts.reach import refuse_if_nothing_listens
from supervisor.jobs.quarantine import UNREACHABLE, Quarantines
from supervisor.jobs.runner._context import RunnerContext
from supervisor.jobs.runner._journal import Journal
from supervisor.spec.model import JobSpec
from supervisor.store.quarantine import Quarantine

_RECHECK_S = 1.0  # a wait on a quarantined GPU looks again this often (a `--clear` ends it)
HOST_VERDICTS = frozenset({Verdict.KILLED.value, UNREACHABLE})


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
            await quarantines.attempt_ended(where, Verdict(verdict) if verdict != UNREACHABLE else UNREACHABLE)
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
                await quarantines.attempt_ended(here, UNREACHABLE)
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
