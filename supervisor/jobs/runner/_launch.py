"""Launching one attempt: numbered and stored as `launching` before the host is asked (a daemon
that dies meanwhile leaves a row the next one's recovery sees), then `running` with its pid (or
its scheduler's job id), and its ``Live`` handles for the watch.

Where the attempt starts from (``StartPoint``: its checkpoint and parameters) and the paces its
watchdog starts from (``Paces``) are worked out here too, below."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import structlog

from supervisor.core.actions import AttemptAction
from supervisor.core.errors import LaunchError, StoreError, SuperviseError, one_line
from supervisor.core.events import AttemptState, EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, LaunchedData
from supervisor.hosts.base import LaunchRequest
from supervisor.jobs import checkpoints
from supervisor.jobs.adjust import params_after
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.paces import PaceStore, spec_fingerprint
from supervisor.jobs.pending import PendingWrites, when_free
from supervisor.jobs.runner import _heartbeat as heartbeat
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._ending import gpu_baseline
from supervisor.jobs.runner._journal import Journal, StartNews
from supervisor.jobs.runner._verdict import prepare as prepare_forensics
from supervisor.notify import notices
from supervisor.spec.adjust import changed
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate
from supervisor.store.database import AttemptRow
from supervisor.watchdog import Judgement, PaceHistory, Watchdog, slow_step


async def launch(run: int, shard: int | None, *, spec: JobSpec, ctx: RunnerContext, journal: Journal,
                 news: StartNews, paces: Paces, start: StartPoint | None = None) -> Live:
    """The next attempt of run ``run`` (of shard ``shard``, for a shard's runner), launched from
    ``start`` (its checkpoint and parameters; None: no checkpoint, the spec's parameters)."""
    store = ctx.store
    start = start or StartPoint()
    own = spec
    spec = start.spec_for(spec)
    await journal.writes.drained()  # the previous attempt's end is stored before the next is numbered
    n = store.next_attempt_number(spec.name)
    log_path, status_path = await ctx.host.log_paths(spec.name, n)
    tag = f"{spec.name}.{n}.{uuid.uuid4().hex[:10]}"
    argv = spec.argv(n, start.checkpoint)
    workdir = spec.resolved_workdir()
    row = AttemptRow(
        job=spec.name, n=n, tag=tag, host=ctx.host.name, argv=argv, workdir=workdir,
        log_path=log_path, status_path=status_path, pid=None, pgid=None, start_time=None,
        started=time.time(), ended=None, state=AttemptState.LAUNCHING, exit_code=None, exit_signal=None,
        log_offset=0, phase=None, progress=None, verdict=None, reason=None, failure=None,
        fingerprint=None, action=None, run=run, shard=shard, checkpoint=start.checkpoint or None,
        params=None if spec is own else dict(spec.params),
    )
    await when_free(lambda: store.add_attempt(row))  # saved before launch: a crash here leaves a visible 'launching' row
    journal.set_job(JobState.RUNNING, f"attempt {n}")
    baseline = gpu_baseline(ctx)
    sock = None
    try:
        env = await asyncio.to_thread(spec.environment, n, start.checkpoint)  # a spec's `env` may be 1 MiB: off the loop
        env.update(await asyncio.to_thread(prepare_forensics, spec, argv, log_path))
        sock = heartbeat.bind(ctx, tag)
        env.update(heartbeat.environment(sock, spec))  # the daemon's own NOTIFY_SOCKET is never passed on
        request = LaunchRequest(argv=argv, workdir=workdir, env=env, log_path=log_path,
                                status_path=status_path, tag=tag, scheduler_args=spec.slurm.sbatch_args(),
                                limits=spec.limits.resource_limits())
        handle = await ctx.host.launch(request)
    except Exception as exc:  # re-raised as a SuperviseError
        # Whatever failed, the attempt ends here: a row left `launching` would be taken for
        # a launch the daemon died in, by the next daemon's recovery.
        if sock is not None:
            sock.close()
        error = exc if isinstance(exc, SuperviseError) else LaunchError(f"launch of {argv[0]} failed: {exc!r}")
        journal.ended(n, AttemptEnd(state=AttemptState.ENDED, verdict=Verdict.CRASHED, reason=str(error),
                                    action=AttemptAction.give_up("launch failed"), at=time.time()))
        raise error from exc
    row.pid, row.pgid, row.start_time, row.state = handle.pid, handle.pgid, handle.start_time, AttemptState.RUNNING
    row.scheduler_id = handle.scheduler_id
    journal.launched(n, AttemptUpdate(pid=handle.pid, pgid=handle.pgid, start_time=handle.start_time,
                                      scheduler_id=handle.scheduler_id))
    news.running(row)
    what = f"pid {handle.pid}" if handle.scheduler_id is None else f"scheduler job {handle.scheduler_id}"
    journal.record(n, EventKind.LAUNCHED, f"attempt {n} launched: {what}",
                   LaunchedData(handle.pid, argv, log_path, ctx.host.name, handle.scheduler_id))
    if said := "; ".join(filter(None, (start.describe(), start.note))):
        journal.action(n, f"attempt {n} starts {said}" if start.describe() else f"attempt {n}: {said}",
                       ActionData(checkpoint=start.checkpoint or None, params=start.params))
    return Live.of(row, handle, paces.new_watchdog(n), event_cap=EventCap(ctx.events_per_attempt),
                   gpu_baseline=baseline, notify=sock)


# Where an attempt starts from: the checkpoint it is given as `{last_checkpoint}`
# (jobs/checkpoints.py) and its parameters after any `[restart.adjust]` change (jobs/adjust.py),
# worked out before its launch and, for a relaunch, said in the alert that announces it.

@dataclass(frozen=True)
class StartPoint:
    checkpoint: str = ""  # "" none
    params: dict[str, str] | None = None  # None: the spec's own
    changes: tuple[str, ...] = ()  # "batch_size=32 (was 64)", against the attempt before
    # What the attempt before failed with is no evidence of a deterministic bug: this one starts
    # from an older checkpoint than the one that failed to load, or with other parameters.
    new_ground: bool = False
    note: str = ""  # why no checkpoint could be listed, when that is so

    def describe(self) -> str:
        """What the next attempt starts from, for the relaunch's alert and the attempt's record."""
        parts = []
        if self.checkpoint:
            parts.append(f"from checkpoint {self.checkpoint}")
        if self.changes:
            parts.append("with " + ", ".join(self.changes))
        return one_line("; ".join(parts), 400)

    def spec_for(self, spec: JobSpec) -> JobSpec:
        """The spec the attempt's command and environment are expanded from."""
        return spec if self.params is None else spec.model_copy(update={"params": self.params})


async def first(spec: JobSpec, ctx: RunnerContext) -> StartPoint:
    """A run's first attempt: the newest complete checkpoint, the spec's parameters."""
    if not spec.checkpoints:
        return StartPoint()
    listing = await checkpoints.list_complete(ctx.host, spec)
    return StartPoint(checkpoint=checkpoints.choose(listing, set()), note=listing.note)


async def after(spec: JobSpec, ctx: RunnerContext, live: Live, verdict: Verdict) -> StartPoint:
    """The attempt after ``live`` (judged ``verdict``): a checkpoint that failed to load in this run
    is passed over for the one before it; parameters changed by the rule for ``verdict``."""
    row = live.row
    params = params_after(spec, row, verdict)
    before = row.params if row.params is not None else spec.params
    changes = tuple(changed(before, params if params is not None else spec.params))
    if not spec.checkpoints:
        return StartPoint(params=params, changes=changes, new_ground=bool(changes))
    run = [r for r in ctx.store.attempts(spec.name) if r.run == row.run and r.shard == row.shard and r.n < row.n]
    bad = checkpoints.failed_to_load(run)
    failed_here = bool(row.checkpoint) and checkpoints.is_failure(verdict) and live.watchdog.progress is None
    if failed_here and row.checkpoint:
        bad.add(row.checkpoint)
    try:
        listing = await checkpoints.list_complete(ctx.host, spec)
    except SuperviseError as exc:
        # The attempt's end is still to be recorded: the next starts where this one did, and says why.
        return StartPoint(checkpoint=row.checkpoint or "", params=params, changes=changes, new_ground=bool(changes),
                          note=str(exc))
    checkpoint = checkpoints.choose(listing, bad)
    older_left = failed_here and bool(checkpoint)
    return StartPoint(checkpoint=checkpoint, params=params, changes=changes, new_ground=older_left or bool(changes),
                      note=listing.note)


# The runner's memory of each bar's pace: earlier attempts' intervals handed to a new attempt's
# watchdog (its stall bounds start from them), this attempt's intervals stored for the next, and a
# step well over its history alerted as ``slow`` (an alert, never a kill).

log = structlog.get_logger("supervise.runner")


@dataclass(frozen=True)
class SlowFound:
    """A bar's step well over its history, not reported before: what the runner alerts."""

    where: str  # the bar and phase, in words
    judgement: Judgement


class Paces:
    """A runner's memory of each bar's pace, composed into the runner (it acts on what this says):
    the history a new attempt's watchdog starts from, this attempt's intervals stored for the
    next, and the slow steps not reported yet."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, writes: PendingWrites) -> None:
        self._spec = spec
        self._ctx = ctx
        self._writes = writes
        self._reported: set[tuple[int, str | None, float]] = set()  # (attempt, bar, step) already reported slow
        self._read_back: set[int] = set()  # attempts whose slow reports stored earlier were read back

    def _host_kind(self) -> str:
        """Where the pace was measured: the host, and the GPU model where one is seen."""
        sample = self._ctx.gpu.latest()
        model = sample.devices[0].name if sample is not None and sample.available and sample.devices else ""
        return f"{self._ctx.host.name}/{model}" if model else self._ctx.host.name

    def history(self, n: int) -> PaceHistory:
        try:
            return PaceStore(self._ctx.store).history(self._spec.name, spec_fingerprint(self._spec),
                                                      self._host_kind(), before=n)
        except StoreError as exc:  # the default bounds still hold
            log.warning("cannot read earlier bar paces", job=self._spec.name, error=str(exc))
            return PaceHistory()

    def new_watchdog(self, n: int, started_at: float | None = None) -> Watchdog:
        return Watchdog(self._spec.health, clock=self._ctx.clock, history=self.history(n), started_at=started_at,
                        max_runtime_s=self._spec.max_runtime)

    def store(self, live: Live) -> None:
        """This attempt's intervals, for the next attempt's bounds (replaced as it goes on)."""
        paces, n = live.watchdog.paces(), live.row.n
        if not paces:
            return
        job, fingerprint, host_kind = self._spec.name, spec_fingerprint(self._spec), self._host_kind()
        store = self._ctx.store
        self._writes.submit(lambda: PaceStore(store).save(job, fingerprint, host_kind, n, paces))

    def new_slow_steps(self, live: Live) -> list[SlowFound]:
        """Steps well over their history, each once per bar and step, across a daemon restart too."""
        found = []
        n = live.row.n
        for _, judgement in live.watchdog.slow():
            if n not in self._read_back:
                # A re-adopted attempt's step a daemon before this one reported (the same alert again
                # after every restart, however often the daemon restarts within one long step).
                self._read_back.add(n)
                self._reported |= self._stored_slow_steps(n)
            step = slow_step(judgement.evidence)
            key = (n, step.bar, float(step.done or 0))
            if key in self._reported:
                continue
            self._reported.add(key)
            found.append(SlowFound(notices.where(live.watchdog.progress, live.watchdog.phase), judgement))
        return found

    def _stored_slow_steps(self, n: int) -> set[tuple[int, str | None, float]]:
        """The steps of attempt ``n`` its stored actions report slow (read once an attempt, and only
        once it has a slow step: a short indexed query)."""
        try:
            actions = self._ctx.store.events(self._spec.name, attempt=n, kinds=[EventKind.ACTION.value])
        except StoreError as exc:  # reported again, at worst
            log.warning("cannot read earlier slow reports", job=self._spec.name, error=str(exc))
            return set()
        return {(n, slow.bar, float(slow.done or 0)) for slow in (ActionData.of(e).slow for e in actions)
                if slow is not None}
