"""A sharded job: N shards of one job running at once, each a runner of its own, then an optional
`gather` step once every shard is done.

Each shard (``Shard``: a ``JobRunner`` composed with the shard's scope and policy) has its own attempts, verdicts, kills, relaunches and backoff: a
failed shard is relaunched alone, and "the same failure twice" is judged within that shard.  The
coordinator (``ShardedJob``) owns the job's state, and one judgement across shards: the same
failure fingerprint on two shards is the code, not the box, so the whole job stops.  A shard
that gives up for another reason leaves the others to finish (their output is kept), and the
job fails once they have ended; `gather` runs only when every shard is done.

Attempts are the job's: numbered in one sequence, each stored with its shard index
(``GATHER_SHARD`` for the gather step), so `attempts`, `logs` and `events` read as for any job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import structlog

from supervisor.core.actions import ActionKind
from supervisor.core.errors import SuperviseError
from supervisor.core.events import FailureKind, JobState, Verdict
from supervisor.gpu.health import GpuFault
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.base import KillReport
from supervisor.hosts.stacks import StackDump
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.policy import Decision, Policy, RestartPolicy, names_the_program
from supervisor.jobs.runner import JobRunner, RunnerContext, StartNews, cancel_until_done
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.jobs.strays import merge_reports
from supervisor.spec.model import JobSpec
from supervisor.spec.placement import Placement
from supervisor.store.database import AttemptRow, Store

log = structlog.get_logger("supervise.sharding")

GATHER_SHARD = -1  # the shard index the gather step's attempts are stored with
_ENDED = {JobState.DONE, JobState.FAILED, JobState.STOPPED}


class ShardScope:
    """What a shard's attempts belong to (a ``Scope``): its index, the coordinator's run, launches
    numbered one at a time across the job's shards; its state goes to the coordinator, which says
    the job's."""

    def __init__(self, store: Store, job: str, coordinator: ShardedJob, shard: int) -> None:
        self.store = store
        self.job = job
        self.shard = shard
        self.coordinator = coordinator
        self.state = JobState.STARTING
        self.reason = ""

    def set_state(self, writes: PendingWrites, state: JobState, reason: str) -> None:
        self.state, self.reason = state, reason
        self.coordinator.shard_moved()

    def run_so_far(self, resume: AttemptRow | None) -> tuple[int, int, str | None]:
        if resume is not None:  # a re-adopted attempt continues its run
            return resume.run, resume.run_attempt - 1, self._previous_fingerprint(resume)
        if not self.coordinator.continuing:
            return self.coordinator.run, 0, None
        # A daemon restart found this shard between attempts (a backoff, a launch it died in): its
        # run goes on with the attempts it has spent and its last failure.
        mine = self._mine()
        return self.coordinator.run, len(mine), mine[-1].fingerprint if mine else None

    def _mine(self) -> list[AttemptRow]:
        """This shard's attempts in the job's current run."""
        return [a for a in self.store.attempts(self.job) if a.shard == self.shard and a.run == self.coordinator.run]

    def _previous_fingerprint(self, resume: AttemptRow) -> str | None:
        mine = [a for a in self.store.attempts(self.job) if a.shard == self.shard and a.n < resume.n]
        return mine[-1].fingerprint if mine else None

    def rest_of_backoff(self, policy: Policy) -> float:
        """After a daemon restart in this shard's backoff: the rest of the wait (the policy's, from
        the failed attempt's end) before its next launch."""
        if not self.coordinator.continuing:
            return 0.0
        mine = self._mine()
        last = mine[-1] if mine else None
        if last is None or last.ended is None or last.action_kind is not ActionKind.RELAUNCH:
            return 0.0
        wait = 0.0 if last.verdict is Verdict.PREEMPTED else policy.wait_after(len(mine))
        return max(0.0, last.ended + wait - time.time())

    def numbering(self) -> asyncio.Lock:
        return self.coordinator.numbering  # one at a time across the job's shards


class Shard:
    """One shard: a job runner composed with the shard's scope, its coordinator's news (the first
    shard's attempt, or its wait, is the start's) and a policy that hears of the failures other
    shards saw.  Its state is its scope's: the coordinator reads it to say the job's."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, coordinator: ShardedJob, index: int) -> None:
        self.index = index
        self.scope = ShardScope(ctx.store, spec.name, coordinator, index)
        self.runner = JobRunner(spec, ctx, self.scope, news=coordinator.news,
                                policy=_ShardPolicy(RestartPolicy(spec.restart), coordinator, index))

    @property
    def state(self) -> JobState:
        return self.scope.state

    @property
    def reason(self) -> str:
        return self.scope.reason

    def ended_before(self) -> None:
        """Its attempt in this run ended done before the daemon restarted: not started again."""
        self.scope.state, self.scope.reason = JobState.DONE, "done before the daemon restarted"


class _ShardPolicy:
    """The shard's own restart policy, and the coordinator's word on failures other shards saw."""

    def __init__(self, inner: Policy, coordinator: ShardedJob, shard: int) -> None:
        self._inner = inner
        self._coordinator = coordinator
        self._shard = shard

    def wait_after(self, attempt: int) -> float:
        return self._inner.wait_after(attempt)

    def decide(self, verdict: Verdict, attempt: int, fingerprint: str | None,
               previous_fingerprint: str | None, failure: FailureKind | None = None) -> Decision:
        decision = self._inner.decide(verdict, attempt, fingerprint, previous_fingerprint, failure)
        if fingerprint is None or not names_the_program(failure) or verdict in (Verdict.HEALTHY, Verdict.DONE):
            return decision
        other = self._coordinator.failure_seen(self._shard, fingerprint)
        if other is None:
            return decision
        return Decision(ActionKind.GIVE_UP, 0.0, f"the same failure (fingerprint {fingerprint[:12]}) on shards {other} "
                                                 f"and {self._shard}: it is the code, not the box; stopping the job")


class ShardedJob:
    """The runner of a sharded job, as the service and the API see it (start, stop, detach,
    snapshot, like a JobRunner)."""

    def __init__(self, spec: JobSpec, context: Callable[[str], RunnerContext]) -> None:
        self.spec = spec
        self._context = context
        self.ctx = context(spec.host)  # the store and the bus, which every shard shares
        self.numbering = asyncio.Lock()
        self.run = 0
        self.news = StartNews()  # what `start` awaits, told by the shards
        self.shards = [self._shard(spec.for_shard(p), p.shard) for p in spec.placements()]
        self.gather: Shard | None = None
        self.task: asyncio.Task[None] | None = None
        self.stopped_by: str | None = None  # why the coordinator stopped every shard, if it did
        self._failures: dict[str, int] = {}  # fingerprint -> the first shard it was seen on
        # The other shards' stops, held so the loop cannot collect them half-way (it keeps only weak references).
        self._stopping: set[asyncio.Task[KillReport]] = set()
        self._stop_requested = False
        self._writes = PendingWrites(spec.name)
        self.resume: dict[int, AttemptRow] = {}  # the live attempts a daemon restart re-adopts, by shard
        self.continuing = False  # a daemon restart took the job's latest run up again

    def _shard(self, spec: JobSpec, shard: int) -> Shard:
        return Shard(spec, self._context(spec.host), self, shard)

    def _running(self) -> list[JobRunner]:
        """The runners of the shards (and gather step) running now."""
        return [s.runner for s in [*self.shards, self.gather] if s is not None and s.runner.running]

    def start(self, resume: dict[int, AttemptRow] | None = None) -> None:
        """Start every shard in a new run; with ``resume`` (a daemon restart, even with no live
        attempt) the latest run goes on: a shard in it re-adopts that attempt, a shard done in the
        run stays done, any other launches its next attempt within the run's budget."""
        self.continuing = resume is not None
        self.task = asyncio.create_task(self._run(resume if resume is not None else {}), name=f"job:{self.spec.name}")

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def hold(self) -> str:
        """`supervise hold`: every running shard postpones its kills."""
        return "; ".join(f"shard {s.index}: {s.runner.hold()}" for s in self.shards if s.runner.running) or "no shard is running"

    def release(self) -> str:
        return "; ".join(f"shard {s.index}: {s.runner.release()}" for s in self.shards if s.runner.running) \
            or "no shard is running"

    async def gpus_sampled(self, host: str, sample: GpuSample) -> None:
        for s in self.shards:
            if s.runner.running:
                await s.runner.gpus_sampled(host, sample)

    async def gpu_fault(self, host: str, fault: GpuFault, device_pids: set[int]) -> bool:
        return any([await s.runner.gpu_fault(host, fault, device_pids) for s in self.shards if s.runner.running])

    async def stacks_now(self) -> StackDump | None:
        """`supervise stack`: every running shard's processes, in one dump."""
        dumps = [d for s in self.shards if s.runner.running and (d := await s.runner.stacks_now()) is not None]
        if not dumps:
            return None
        return StackDump(tuple(p for d in dumps for p in d.processes), "; ".join(d.note for d in dumps if d.note),
                         sum(len(d.processes) + d.left_out for d in dumps))

    @property
    def gpu_wait(self) -> str | None:
        """While any shard's launch waits for GPU memory other processes hold: for what (`start` says it)."""
        return "; ".join(f"shard {s.index}: {s.runner.gpu_wait}" for s in self.shards if s.runner.gpu_wait) or None

    @property
    def error(self) -> SuperviseError | None:
        """What ended a shard's runner, if an error did (`start` reports the first)."""
        return next((s.runner.error for s in [*self.shards, self.gather] if s is not None and s.runner.error is not None),
                    None)

    async def _run(self, resume: dict[int, AttemptRow]) -> None:
        try:
            # A re-adopted shard continues its run; a fresh `start` opens a new run for every shard.
            rows = self.ctx.store.attempts(self.spec.name)
            latest_run = max((r.run for r in rows), default=0)
            self.run = max((r.run for r in resume.values()), default=0) or (
                latest_run if self.continuing and latest_run else latest_run + 1)
            done_before = self._done_before()
            for shard in self.shards:
                if shard.index in done_before:
                    shard.ended_before()
                else:
                    shard.runner.start(resume.get(shard.index))
            await asyncio.gather(*(s.runner.task for s in self.shards if s.runner.task is not None), return_exceptions=True)
            if all(r.state is JobState.DONE for r in self.shards) and self.spec.gather and not self._stop_requested:
                await self._gather(resume.get(GATHER_SHARD), GATHER_SHARD in done_before)
            self._finish()
        finally:
            await self._writes.drained()

    def _done_before(self) -> set[int]:
        """After a daemon restart: the shards (and gather) whose attempt in this run already ended done."""
        if not self.continuing:
            return set()
        return {a.shard for a in self.ctx.store.attempts(self.spec.name)
                if a.run == self.run and a.verdict is Verdict.DONE and a.shard is not None}

    async def _gather(self, resume: AttemptRow | None, done: bool) -> None:
        placement = Placement(GATHER_SHARD, self.spec.host, None)
        spec = self.spec.for_shard(placement).model_copy(update={"command": self.spec.gather})
        self.gather = self._shard(spec, GATHER_SHARD)
        if done:  # it ran to its end before the daemon restarted: never twice
            self.gather.ended_before()
            return
        self.shard_moved()
        runner = self.gather.runner
        runner.start(resume)
        if runner.task is not None:
            with contextlib.suppress(Exception):
                await runner.task

    def _finish(self) -> None:
        gather = self.gather
        if self._stop_requested:
            state, reason = JobState.STOPPED, "stopped by user"
        elif self.stopped_by is not None:
            state, reason = JobState.FAILED, self.stopped_by
        elif any(r.state is not JobState.DONE for r in self.shards):
            bad = [r for r in self.shards if r.state is not JobState.DONE]
            state, reason = JobState.FAILED, f"shard {bad[0].index} {bad[0].state}: {bad[0].reason}" + (
                f" (and {len(bad) - 1} more shards)" if len(bad) > 1 else "")
        elif gather is not None and gather.state is not JobState.DONE:
            state, reason = JobState.FAILED, f"gather {gather.state}: {gather.reason}"
        else:
            state, reason = JobState.DONE, f"{len(self.shards)} shards done" + (", gathered" if gather else "")
        self._set_job(state, reason)

    # -- what shards report -------------------------------------------------------------

    def shard_moved(self) -> None:
        """A shard's state changed: the job's state says where the shards stand now."""
        if self.gather is not None:
            if self.gather.state not in _ENDED:
                self._set_job(self.gather.state, f"gather: {self.gather.reason}")
            return
        if all(r.state in _ENDED for r in self.shards):
            return  # the job's end is `_finish`'s to say, after any gather
        counts = Counter(r.state for r in self.shards)
        state = JobState.WAITING if counts[JobState.WAITING] == len(self.shards) else JobState.RUNNING
        self._set_job(state, summary(counts, len(self.shards)))

    def failure_seen(self, shard: int, fingerprint: str) -> int | None:
        """Note a shard's failure; the other shard it was seen on before, if any (the job then stops)."""
        first = self._failures.setdefault(fingerprint, shard)
        if first == shard:
            return None
        self.stopped_by = (f"the same failure (fingerprint {fingerprint[:12]}) on shards {first} and {shard}: "
                           "it is the code, not the box; stopped every shard")
        log.info("deterministic failure across shards: stopping the job", job=self.spec.name, shards=[first, shard])
        for other in self.shards:
            if other.index != shard and other.runner.running:
                task = asyncio.create_task(other.runner.stop(), name=f"stop:{self.spec.name}:{other.index}")
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        return first

    def _set_job(self, state: JobState, reason: str) -> None:
        self._writes.submit(lambda: self.ctx.recorder.job_state(self.spec.name, state, reason))
        self.news.said(state)

    # -- what the service and the API call ----------------------------------------------

    async def stop(self, grace_s: float | None = None) -> KillReport:
        self._stop_requested = True
        reports = await asyncio.gather(*(r.stop(grace_s) for r in self._running()))
        report = KillReport()
        for each in reports:
            merge_reports(report, each)
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=30)
        return report

    async def detach(self) -> None:
        self._writes.close()
        for shard in [*self.shards, self.gather]:
            if shard is not None:
                await shard.runner.detach()
        if self.task is not None:
            await cancel_until_done(self.task)

    def snapshot(self) -> RunnerSnapshot:
        shards = tuple(s.runner.snapshot() for s in [*self.shards, self.gather] if s is not None)
        return RunnerSnapshot(job=self.spec.name, attempt=None, shards=shards)


def summary(counts: Counter[JobState], total: int) -> str:
    """`4 shards: 1 done, 2 running, 1 backoff`: each state that has shards, in a fixed order."""
    parts = [f"{counts[s]} {s}" for s in JobState if counts[s]]
    return f"{total} shards: " + ", ".join(parts)
