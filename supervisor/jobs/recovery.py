"""The recovery pass a daemon runs at start-up, before it listens: every attempt the store
believes running is re-adopted if its pid *and* start time still match, else finished from its
exit-status file, else marked lost; a sharded job's live shards are re-adopted together by its
coordinator, and a sharded job the daemon stopped under between attempts goes on with its run.
Each outcome is a note (said in the log and in `supervise status`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog

from supervisor.core.errors import SpecError, SuperviseError
from supervisor.core.events import AttemptState, JobState
from supervisor.core.host_url import is_local
from supervisor.hosts.base import ExitStatus, ProcessHandle
from supervisor.hosts.registry import Hosts
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner_protocol import Runner
from supervisor.jobs.sharding import ShardedJob
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import AttemptEnd, ExitCode
from supervisor.store.database import AttemptRow

_TAKEN_UP = (JobState.RUNNING, JobState.BACKOFF)  # a sharded job's states that a restarted daemon goes on with
log = structlog.get_logger("supervise.daemon")


class Recovery:
    """One pass; the runners it makes are the caller's (``start_runner``, ``sharded``: a sharded
    job's coordinator, made without starting it), ``runners`` what the caller holds already."""

    def __init__(self, recorder: Recorder, hosts: Hosts, runners: Mapping[str, Runner],
                 start_runner: Callable[..., Runner], sharded: Callable[[JobSpec], ShardedJob]) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.hosts = hosts
        self.runners = runners
        self.start_runner = start_runner
        self.sharded = sharded
        self.recovery_notes: list[str] = []

    async def run(self) -> list[str]:
        """Re-adopt, finish or mark lost every attempt the store thinks is running; what each came to."""
        rows = self.store.live_attempts()
        for row in [r for r in rows if r.shard is not None]:
            self.recovery_notes.append(self._recover_shard(row))
        self.recovery_notes += self._resume_idle_sharded_jobs()
        for row in [r for r in rows if r.shard is None]:
            try:
                note = await self._recover_one(row)
            except SuperviseError as exc:  # e.g. its probe pack is gone: start-up goes on, the job says why
                note = f"{row.job}#{row.n}: not re-adopted: {exc}"
            self.recovery_notes.append(note)
            log.info("recovery", job=row.job, attempt=row.n, outcome=note)
        if not self.recovery_notes:
            log.info("recovery: nothing was running")
        return self.recovery_notes

    async def _recover_one(self, row: AttemptRow) -> str:
        try:
            job = self.store.job(row.job)
            spec, why = job.spec, job.spec_error or ""
        except SuperviseError as exc:
            spec, why = None, str(exc)
        if spec is None:
            self.recorder.attempt_ended(row.job, row.n, AttemptEnd(state=AttemptState.LOST,
                                                                   reason=f"spec unreadable on recovery: {why}"))
            return f"{row.job}#{row.n}: lost (spec unreadable)"
        handle = ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                               tag=row.tag, log_path=row.log_path, status_path=row.status_path,
                               scheduler_id=row.scheduler_id)
        latest = self.store.latest_attempt(row.job)
        superseded = latest is not None and latest.n != row.n
        if not is_local(spec.host):
            if superseded:
                return f"{row.job}#{row.n}: superseded by a newer attempt on {spec.host}; left as it is"
            # A remote box may be unreachable right now: never hold up start-up for it.  The
            # runner re-adopts the attempt and its host reconnects with backoff.
            self.start_runner(spec, resume=row)
            return f"{row.job}#{row.n}: re-adopted on {spec.host} (its runner checks liveness)"
        host = self.hosts.get(spec.host).host
        alive = row.pid is not None and await host.is_alive(handle)
        status = None if alive else await host.exit_status(handle)
        if superseded:
            # A newer attempt ran after it: its result and the job's state are the newer one's.
            return self._recover_superseded(row, alive, status)
        if row.pid is None or (not alive and status is None and row.state is AttemptState.LAUNCHING):
            self.recorder.attempt_ended(row.job, row.n, AttemptEnd(state=AttemptState.LOST,
                                                                   reason="the daemon stopped while launching it"))
            self.recorder.job_state(row.job, JobState.FAILED, "attempt lost during launch; start the job again")
            return f"{row.job}#{row.n}: lost during launch"
        # Alive, or ended while we were away: either way the runner drains the log from the
        # saved offset and judges it; a dead wrapper is noticed at once by wait_exit.
        self.start_runner(spec, resume=row)
        return f"{row.job}#{row.n}: {'re-adopted pid ' + str(row.pid) if alive else 'ended while the daemon was down; finishing'}"

    def _recover_superseded(self, row: AttemptRow, alive: bool, status: ExitStatus | None) -> str:
        """An attempt the store thinks running, older than the job's latest: it is finished as
        far as it can be, the job is left as the newer attempt set it.  One still alive is left
        alone, said here and by `status`; `supervise stop` reaches it."""
        if alive:
            return f"{row.job}#{row.n}: still alive but superseded by a newer attempt; `supervise stop {row.job}` ends it"
        if status is not None:
            end = AttemptEnd(state=AttemptState.ENDED, exit=ExitCode(status.returncode, status.signal),
                             reason=f"ended unsupervised: the command {status.describe()}")
        else:
            end = AttemptEnd(state=AttemptState.LOST,
                             reason="lost: no process and no exit status (the daemon stopped while it launched)")
        self.recorder.attempt_ended(row.job, row.n, end)
        return f"{row.job}#{row.n}: superseded by a newer attempt; marked {end.state}"

    def _recover_shard(self, row: AttemptRow) -> str:
        """A shard's attempt: its job's coordinator re-adopts it with the job's other live shards."""
        where = f"{row.job}#{row.n} (shard {row.shard})"
        if row.pid is None:  # the daemon stopped while launching it: the shard launches again
            self.recorder.attempt_ended(row.job, row.n, AttemptEnd(state=AttemptState.LOST,
                                                                   reason="the daemon stopped while launching it"))
            return f"{where}: lost during launch; its shard launches again"
        try:
            spec = self.store.job(row.job).spec
            if spec is None:
                raise SpecError(f"its stored spec no longer validates ({self.store.job(row.job).spec_error})")
            job = self.sharded(spec)
            job.resume[row.shard if row.shard is not None else 0] = row
        except SuperviseError as exc:
            self.recorder.attempt_ended(row.job, row.n, AttemptEnd(state=AttemptState.LOST, reason=f"not re-adopted: {exc}"))
            return f"{where}: lost ({exc})"
        if not job.running:
            job.start(job.resume)  # the resume map fills before the loop runs: recovery does not await
        return f"{where}: re-adopted with its job's shards"

    def _resume_idle_sharded_jobs(self) -> list[str]:
        """Sharded jobs the daemon stopped under while none of their attempts ran (a shard in its
        backoff, the others done, or the gather not launched yet): their run goes on."""
        notes = []
        for job in self.store.jobs():
            if job.shards <= 1 or job.state not in _TAKEN_UP or job.name in self.runners:
                continue
            if not any(a.shard is not None for a in self.store.attempts(job.name)):
                continue  # never launched: `start` failed before any shard, nothing to go on with
            try:
                if job.spec is None:
                    raise SpecError(f"its stored spec no longer validates ({job.spec_error})")
                sharded = self.sharded(job.spec)
            except SuperviseError as exc:
                self.recorder.job_state(job.name, JobState.FAILED, f"not taken up again on recovery: {exc}")
                notes.append(f"{job.name}: not taken up again ({exc})")
                continue
            sharded.start({})
            notes.append(f"{job.name}: no shard was running; its run goes on")
        return notes
