"""The jobs domain: ``Supervisor`` owns the daemon's runners, one per job, and every verb on
them (start, stop, restart, remove, hold, release, prune, recover, status).  Nothing else adds,
replaces or drops a runner: the API and the web page translate requests into these calls, the
pipelines start their steps through ``start_runner``, readers get a read-only view.

What a runner did is awaited, never polled from the store: `start` awaits the runner's news (its
first attempt running, a wait said at once, or its end), a stop awaits the runner's task, and a
follower of an attempt's log learns of its end from the bus (every attempt's end is recorded
with an event, store first, then published).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from supervisor.core import protocol
from supervisor.core.errors import (
    AlreadyRunning,
    NotFound,
    RequestRejected,
    SuperviseError,
    error_of,
    http_status,
    row_of,
)
from supervisor.core.events import EventKind, JobState
from supervisor.hosts.registry import Hosts
from supervisor.jobs.dependencies import check_after
from supervisor.jobs.pending import when_free
from supervisor.jobs.pipelines import Pipelines
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.recovery import Recovery
from supervisor.jobs.runner import JobRunner, RunnerContext
from supervisor.jobs.runner_protocol import Runner
from supervisor.jobs.sharding import ShardedJob
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.jobs.stopping import VERB_STORE_WAIT_S, Stopping
from supervisor.jobs.views import job_statuses
from supervisor.spec.model import JobSpec
from supervisor.store import arrivals
from supervisor.store.database import AttemptRow
from supervisor.store.retention import Retention, prune_events, prune_logs, remove_logs

_LAUNCH_WITHIN_S = 60.0
_ENDING = frozenset({EventKind.ACTION, EventKind.EXITED, EventKind.STATE})  # `start` answers 504 past this, never hangs


class Supervisor:
    """The daemon's jobs: their runners and the verbs on them."""

    def __init__(self, recorder: Recorder, hosts: Hosts, context: Callable[[str], RunnerContext],
                 retention: Retention, arrivals_dir: Path) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.bus = recorder.bus
        self.hosts = hosts
        self.context = context
        self.retention = retention
        self.arrivals = arrivals_dir
        self._runners: dict[str, Runner] = {}
        self._sharded: dict[str, ShardedJob] = {}  # the sharded jobs among them: recovery fills in their shards
        self.runners: Mapping[str, Runner] = MappingProxyType(self._runners)  # readers' view
        self.pipelines = Pipelines(recorder, hosts, self.runners, self.start_runner)
        self._stopping = Stopping(recorder, hosts, self.runners, self.pipelines)

    # -- runners --------------------------------------------------------------------------

    def start_runner(self, spec: JobSpec, resume: AttemptRow | None = None) -> Runner:
        """Give the job a new runner and start it (``resume``: re-adopt that attempt)."""
        try:
            runner, start = self._made(spec, resume)
        except SuperviseError as exc:
            # No runner will ever move this job on: its state must say so, not stay `starting`.
            self.recorder.job_state(spec.name, JobState.FAILED, f"cannot supervise it: {exc}")
            raise
        self._runners[spec.name] = runner
        start()
        return runner

    def _made(self, spec: JobSpec, resume: AttemptRow | None) -> tuple[Runner, Callable[[], None]]:
        """A new runner of the kind the spec calls for, and how it starts: the one place that names
        the kinds (everything else holds a ``Runner``)."""
        if spec.shards > 1:
            sharded = self._sharded[spec.name] = ShardedJob(spec, self.context)
            return sharded, sharded.start
        # A pool's re-adopted attempt is watched where it runs; a new one is placed by the runner.
        host = resume.host if resume is not None and spec.hosts else spec.host
        one = JobRunner(spec, self.context(host))
        return one, lambda: one.start(resume)

    def sharded(self, spec: JobSpec) -> ShardedJob:
        """The job's sharded runner, made (not started) if it has none: recovery fills in its shards."""
        job = self._sharded.get(spec.name)
        if job is None or self._runners.get(spec.name) is not job:
            job = self._runners[spec.name] = self._sharded[spec.name] = ShardedJob(spec, self.context)
        return job

    def running(self, name: str) -> bool:
        runner = self._runners.get(name)
        return runner is not None and runner.running

    def running_count(self) -> int:
        return sum(1 for r in self._runners.values() if r.running)

    def snapshot(self, name: str) -> RunnerSnapshot | None:
        """The job's runner as it stands now; None when no runner was started for it."""
        runner = self._runners.get(name)
        return runner.snapshot() if runner is not None else None

    async def detach_all(self) -> None:
        """The daemon stops: every runner stops watching, its job keeps running."""
        for runner in self._runners.values():
            await runner.detach()

    # -- verbs ----------------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """The start-up pass: re-adopt, finish or mark lost every attempt the store thinks running;
        then the jobs waiting for their `after` get their runners back."""
        notes = await Recovery(self.recorder, self.hosts, self.runners, self.start_runner, self.sharded).run()
        return notes + self.pipelines.resume_waiting()

    def refuse_start(self, spec: JobSpec) -> None:
        """A start that cannot be: the job runs already, or it runs after a job that is unknown."""
        if self.running(spec.name):
            raise AlreadyRunning(f"job '{spec.name}' is already running; `supervise stop {spec.name}` first")
        check_after(self.store, {spec.name: spec.after})

    async def launch(self, spec: JobSpec) -> protocol.StartResponse:
        """Store the job, start its runner, and answer once its first attempt runs or it waits."""
        await when_free(lambda: self._store_job(spec), within_s=VERB_STORE_WAIT_S)
        first = self.store.next_attempt_number(spec.name)  # this run's first: its shards number on from it
        runner = self.start_runner(spec)
        row = await self._first_news(spec, runner)
        if row is None and (waiting := runner.gpu_wait) is not None:
            # Said at once, never after a silent minute; `--follow` follows the attempt that waits.
            return protocol.StartResponse(job=spec.name, attempt=self.store.next_attempt_number(spec.name),
                                          log_path="", message=f"{spec.name}: {waiting}")
        if row is None:  # held by its `after`
            job = self.store.job(spec.name)
            return protocol.StartResponse(job=spec.name, attempt=0, log_path="", message=f"{spec.name} {job.state}: {job.reason}",
                                          held=job.state)
        if spec.shards > 1:  # the attempt seen first may be any shard's: say the run's range, not its pid
            message = (f"started {spec.name}: {spec.shards} shards, attempts from {first} "
                       f"(`supervise status {spec.name}` shows each)")
        else:
            message = f"started {spec.name} attempt {row.n} (pid {row.pid})"
        return protocol.StartResponse(job=spec.name, attempt=row.n, log_path=row.log_path, message=message)

    def _store_job(self, spec: JobSpec) -> None:
        """The job's spec, stored; its state `starting`, recorded (and said on the bus)."""
        self.store.upsert_job(spec.name, spec.model_dump(mode="json"), JobState.STARTING)
        self.recorder.job_state(spec.name, JobState.STARTING)

    async def _first_news(self, spec: JobSpec, runner: Runner) -> AttemptRow | None:
        """The start's first attempt once it runs; None when the start is held: by its `after`,
        by GPU memory other processes hold, or cancelled."""
        deadline = asyncio.get_running_loop().time() + _LAUNCH_WITHIN_S
        news = runner.news
        while True:
            await news.first(runner.task, deadline - asyncio.get_running_loop().time())
            if news.attempt is not None:
                return news.attempt
            if not runner.running:
                job = self.store.job(spec.name)  # stored: the runner drains its writes before it ends
                if job.state is JobState.CANCELLED:
                    return None
                raise _start_failure(spec.name, runner, job.reason)
            if news.held.is_set() and (spec.after or runner.gpu_wait is not None):
                return None  # `status` says for what it waits
            if news.held.is_set():  # a wait for GPUs over before this looked: the launch comes
                news.held.clear()
                continue
            raise RequestRejected(f"{spec.name} did not launch within 60s: `supervise status {spec.name}` "
                                  "says where it stands", 504)

    async def stop(self, name: str, grace_s: float | None) -> protocol.StopResponse:
        """Stop a job (or a pipeline of that name): its runner and every attempt of it still alive."""
        return await self._stopping.stop(name, grace_s)

    async def restart(self, spec: JobSpec, grace_s: float | None) -> protocol.RestartResponse:
        """Stop the job if it runs, then start it with ``spec`` (checked by the caller)."""
        stopped = await self._stopping.stop_job(spec.name, grace_s)
        return protocol.RestartResponse(stopped=stopped, started=await self.launch(spec))

    async def remove(self, name: str, *, logs: bool) -> protocol.RemoveResponse:
        """Forget a job that is not running; its attempt logs stay unless ``logs``."""
        self.store.job(name)
        attempts = self.store.attempts(name)
        if self.running(name) or any(a.state.active for a in attempts):
            # Say what it is doing: a job waiting for GPUs or for its `after` runs nothing yet.
            state = self.store.job(name).state
            doing = "is running" if state is JobState.RUNNING else f"is {state.value} (not ended)"
            raise AlreadyRunning(f"job '{name}' {doing}; `supervise stop {name}` first, then `supervise rm {name}`")
        await when_free(lambda: self.store.delete_job(name), within_s=VERB_STORE_WAIT_S)
        self._runners.pop(name, None)
        self._sharded.pop(name, None)
        if logs:
            removed = remove_logs(attempts)
            arrivals.forget_job(self.arrivals, name)
            message = f"forgot {name} ({len(attempts)} attempts) and deleted {len(removed)} log files"
        else:
            removed = []
            kept = f"; its logs stay in {Path(attempts[0].log_path).parent}" if attempts else ""
            message = f"forgot {name} ({len(attempts)} attempts){kept}"
        return protocol.RemoveResponse(job=name, message=message, removed_logs=removed)

    def prune(self, only: str | None) -> protocol.PruneResponse:
        """Apply the log retention settings now, to one job or all."""
        names = [self.store.job(only).name] if only else [row.name for row in self.store.jobs()]
        rule = self.retention
        removed = [p for name in names for p in prune_logs(self.store.attempts(name), rule)]
        arrivals.forget(self.arrivals, [(p.job, p.attempt) for p in removed])
        prune_events(self.store, removed)
        freed = sum(p.size for p in removed)
        message = (f"removed {len(removed)} attempt logs ({freed} bytes); keeping the last {rule.keep_attempts} per job"
                   + (f" within {rule.max_bytes} bytes" if rule.max_bytes else ""))
        return protocol.PruneResponse(message=message, removed=[
            protocol.PrunedLog(job=p.job, attempt=p.attempt, log_path=p.path, bytes=p.size) for p in removed])

    def hold(self, name: str, *, hold: bool) -> protocol.HoldResponse:
        """`hold`: postpone any kill of a running job until `release`; `release`: let kills come again."""
        self.store.job(name)  # an unknown job: 404
        runner = self._runners.get(name)
        if runner is None or not runner.running:
            return protocol.HoldResponse(job=name, held=False, message=f"{name} is not running: nothing to "
                                                                       f"{'hold' if hold else 'release'}")
        message = runner.hold() if hold else runner.release()
        return protocol.HoldResponse(job=name, held=hold, message=message)

    def status(self, only: str | None) -> tuple[list[protocol.JobStatus], list[protocol.PipelineStatus]]:
        """Each job (``only``: that job, or that pipeline's steps) and each pipeline, as they stand."""
        pipelines = self.pipelines.statuses(only)
        if only and pipelines:  # a pipeline's name: it and its steps' jobs
            steps = {s.job for s in pipelines[0].steps}
            rows = [row for row in self.store.jobs() if row.name in steps]
        else:
            rows = [self.store.job(only)] if only else self.store.jobs()
        return job_statuses(rows, self.store, self.snapshot), pipelines

    # -- what readers await ---------------------------------------------------------------

    def ended(self, name: str) -> bool:
        """No runner moves the job on now (none was started, or it has ended)."""
        return not self.running(name)

    async def attempt_ended(self, job: str, n: int, gone: Callable[[], bool], check_s: float = 0.25) -> None:
        """Until the attempt has ended (or ``gone()``: the reader left).  The store is read again
        only when the bus brings news of the job that may end it: every end of an attempt is
        recorded before an event of these kinds (the action taken, its exit, the job's state)."""
        sub = self.bus.stream()
        try:
            while not gone():
                try:
                    if not self.store.attempt(job, n).state.active:
                        return
                except NotFound:  # removed meanwhile (`supervise rm`)
                    return
                while not gone():
                    try:
                        batch = await asyncio.wait_for(sub.queue.get(), timeout=check_s)
                    except TimeoutError:
                        continue
                    if batch is None:  # a reader too slow for the bus: read the store and wait again
                        sub.close()
                        sub = self.bus.stream()
                        break
                    if any(e.job == job and e.kind in _ENDING for e in batch):
                        break
        finally:
            sub.close()


def _start_failure(job: str, runner: Runner, reason: str) -> SuperviseError:
    """Why the runner ended before its first attempt ran, as the class of the error that ended it
    (a host that cannot be reached: ConnectionLost, 69).  No error: it refused to launch (GPUs
    held by other processes, or a stop while it waited for them): the request is refused (69)."""
    cause = runner.error
    if cause is None:
        return RequestRejected(f"could not start {job}: {reason}", 503)
    return error_of(row_of(cause).kind, f"could not start {job}: {cause}", http_status(cause))
