"""The daemon's service lifecycle: start-up, the recovery pass, the job runners, shutdown.

Start-up runs a recovery pass (said in the log and in `supervise status`): every attempt
the store believes running is re-adopted if its pid *and* start time still match, else
finished from its exit-status file, else marked lost; a re-adopted attempt's runner rebuilds its
watchdog from the stored events' own times and says how long it went unwatched (from the old
daemon's heartbeat, stored every few seconds).  Shutdown (SIGTERM/SIGINT) detaches
from jobs without touching them — they live in their own sessions and the next daemon
re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from typing import Any

import structlog
from aiohttp import web
from pydantic import ValidationError

from . import __version__
from .alerts import AlertCounts, Alerter
from .api import build_app
from .bus import EventBus
from .config import DaemonSettings, LoadedSettings, Paths
from .errors import DaemonError, SuperviseError
from .events import AttemptState, Event, EventKind, JobState
from .filemodes import secure_state_dir
from .hosts.base import ExitStatus, Host, ProcessHandle
from .hosts.local import LocalHost
from .hosts.registry import Hosts
from .gpu_faults import GpuRouter
from .metrics import HostReading, JobReading, Metrics, serve_tcp
from .pipelines import Pipelines
from .retention import Retention, prune_arrivals, prune_events, prune_logs
from .runner import GpuView, JobRunner, RunnerContext
from .shard_views import ShardRows, shard_rows
from .sharding import ShardedJob
from .snapshot import RunnerSnapshot
from .spec import JobSpec
from .store import AttemptRow, JobRow, Store
from .web import WebUi

_TAKEN_UP = (JobState.RUNNING, JobState.BACKOFF)  # a sharded job's states that a restarted daemon goes on with
log = structlog.get_logger("supervise.daemon")

_LOGGED_KINDS = {EventKind.FAILURE, EventKind.VERDICT, EventKind.ACTION, EventKind.EXITED, EventKind.LAUNCHED,
                 EventKind.ALERT}


_HEARTBEAT_S = 2.0  # how often the store hears that the daemon is alive


class Service:
    """The daemon's lifecycle: start-up (lock, recovery pass, listening), the runners, shutdown."""

    def __init__(self, paths: Paths, settings: DaemonSettings, host: Host | None = None,
                 nvml: Any | None = None, loaded: LoadedSettings | None = None) -> None:
        self.paths = paths
        self.settings = settings
        self.loaded = loaded or LoadedSettings(settings, {}, paths.state_dir / "config.toml", False)
        secure_state_dir(paths)  # 0700 and 0600: specs hold tokens, logs hold anything
        self.store = Store(paths.db)
        self.bus = EventBus()
        local = host or LocalHost(paths.logs, poll_interval_s=settings.poll_interval_s, nvml=nvml,
                                   kernel_log=settings.kernel_log or None)
        # GPU samples and faults go to the attempts using those GPUs (and faults to the metrics).
        self.hosts = Hosts(self.store, settings, local, on_sample=lambda *sampled: self._gpu_router(*sampled))
        self.alerter = Alerter(list(settings.alert_urls), min_interval_s=settings.alert_min_interval_s)
        self.runners: dict[str, JobRunner | ShardedJob] = {}
        self.pipelines = Pipelines(self.store, self.hosts, self.runners, self.start_runner)
        self.recovery_notes: list[str] = []
        self.down_since: float | None = None  # the previous daemon's last heartbeat (what re-adoptions say)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.bus.subscribe(self._log_event)
        self.bus.subscribe(self._prune_on_launch)
        self.metrics = Metrics(self)  # reads job_readings() and host_readings()
        self.bus.subscribe(self.metrics.on_events)
        self._gpu_router = GpuRouter(lambda: self.runners.values(), self.metrics)
        self._metrics_runner: web.AppRunner | None = None
        self.web = WebUi(self)  # off until `supervise web`; then back at every start (state_dir/web.json)

    # -- lifecycle ---------------------------------------------------------------------

    def context(self, host_name: str) -> RunnerContext:
        slot = self.hosts.get(host_name)
        gpu = slot.gpu
        return RunnerContext(store=self.store, bus=self.bus, host=slot.host,
                             alerter=self.alerter, gpu=GpuView(gpu.sample, lambda: gpu.latest, gpu.next_sample),
                             records_seen=self.metrics.records_seen, down_since=self.down_since,
                             arrivals=self.paths.arrivals)

    def _lock(self) -> None:
        """One daemon per state directory: an advisory lock held for the daemon's lifetime."""
        self._lock_file = open(self.paths.state_dir / "daemon.lock", "w")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DaemonError(f"another daemon already runs for {self.paths.state_dir} (see {self.paths.pid_file})") from exc

    async def serve(self) -> None:
        self._lock()
        # Read before this daemon beats: how long the jobs it re-adopts went unwatched.
        self.down_since = self.store.last_beat()
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="heartbeat"))
        await self.hosts.local.gpu.sample()
        await self.recover()
        self.recovery_notes += self.pipelines.resume_waiting()  # jobs waiting for their `after`
        # A client that never finishes its request is disconnected after request_timeout_s:
        # aiohttp's idle timer runs from the connection's start until a whole request is parsed,
        # and lingering over an unread body is cut to the same bound.
        timeout = self.settings.request_timeout_s
        runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False,
                               keepalive_timeout=timeout, lingering_time=timeout)
        await runner.setup()
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()  # a previous daemon's socket; we hold the pid-file lock
        site = web.UnixSite(runner, str(self.paths.socket))
        old_umask = os.umask(0o177)  # the socket is born 0600: only this user may drive the daemon
        try:
            await site.start()
        finally:
            os.umask(old_umask)
        self.paths.pid_file.write_text(f"{os.getpid()}\n")
        self._tasks.append(asyncio.create_task(self.metrics.measure_loop_lag(self.settings.loop_lag_interval_s),
                                               name="loop-lag"))
        if self.settings.metrics_bind is not None:
            self._metrics_runner = await serve_tcp(self.metrics, *self.settings.metrics_bind)
        await self.web.resume()
        log.info("daemon listening", socket=str(self.paths.socket), pid=os.getpid(), version=__version__)
        try:
            await self._stopping.wait()
        finally:
            await self.shutdown(runner)

    async def _heartbeat(self) -> None:
        """Store that the daemon is alive, every few seconds: after a crash, the next daemon says
        how long jobs went unwatched (to within this interval)."""
        while True:
            with contextlib.suppress(SuperviseError):  # a full disk: the next beat tries again
                self.store.beat(time.time())
            await asyncio.sleep(_HEARTBEAT_S)

    def request_stop(self) -> None:
        self._stopping.set()

    async def shutdown(self, runner: web.AppRunner) -> None:
        log.info("daemon stopping: jobs keep running and will be re-adopted", jobs=len(self.runners))
        for job_runner in self.runners.values():
            await job_runner.detach()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        await self.web.close()
        await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.paths.pid_file.unlink()
        await self.hosts.close()
        # The last alerts (a job given up just now) get a moment; a hanging endpoint, no more.
        await self.alerter.close(timeout_s=2.0)
        self.store.close()

    async def recover(self) -> None:
        """Re-adopt, finish or mark lost every attempt the store thinks is running."""
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

    async def _recover_one(self, row: AttemptRow) -> str:
        try:
            spec = JobSpec.model_validate(self.store.job(row.job).spec)
        except (ValidationError, SuperviseError) as exc:
            self.store.update_attempt(row.job, row.n, state=AttemptState.LOST, reason=f"spec unreadable on recovery: {exc}")
            return f"{row.job}#{row.n}: lost (spec unreadable)"
        handle = ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                               tag=row.tag, log_path=row.log_path, status_path=row.status_path,
                               scheduler_id=row.scheduler_id)
        latest = self.store.latest_attempt(row.job)
        superseded = latest is not None and latest.n != row.n
        if spec.host != "local":
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
            self.store.update_attempt(row.job, row.n, state=AttemptState.LOST, ended=time.time(),
                                      reason="the daemon stopped while launching it")
            self.store.set_job_state(row.job, JobState.FAILED, "attempt lost during launch; start the job again")
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
        fields: dict[str, Any] = {"state": AttemptState.LOST, "ended": time.time()}
        if status is not None:
            fields.update(exit_code=status.returncode, exit_signal=status.signal, state=AttemptState.ENDED,
                          reason=f"ended unsupervised: the command {status.describe()}")
        else:
            fields["reason"] = "lost: no process and no exit status (the daemon stopped while it launched)"
        self.store.update_attempt(row.job, row.n, **fields)
        return f"{row.job}#{row.n}: superseded by a newer attempt; marked {fields['state']}"

    def _recover_shard(self, row: AttemptRow) -> str:
        """A shard's attempt: its job's coordinator re-adopts it with the job's other live shards."""
        where = f"{row.job}#{row.n} (shard {row.shard})"
        if row.pid is None:  # the daemon stopped while launching it: the shard launches again
            self.store.update_attempt(row.job, row.n, state=AttemptState.LOST, ended=time.time(),
                                      reason="the daemon stopped while launching it")
            return f"{where}: lost during launch; its shard launches again"
        try:
            spec = JobSpec.model_validate(self.store.job(row.job).spec)
            job = self.runners.get(row.job)
            if not isinstance(job, ShardedJob):
                job = self.runners[row.job] = ShardedJob(spec, self.context)
            job.resume[row.shard if row.shard is not None else 0] = row
        except (ValidationError, SuperviseError) as exc:
            self.store.update_attempt(row.job, row.n, state=AttemptState.LOST, reason=f"not re-adopted: {exc}")
            return f"{where}: lost ({exc})"
        if not job.running:
            job.start(job.resume)  # the resume map fills before the loop runs: recovery does not await
        return f"{where}: re-adopted with its job's shards"

    def _resume_idle_sharded_jobs(self) -> list[str]:
        """Sharded jobs the daemon stopped under while none of their attempts ran (a shard in its
        backoff, the others done, or the gather not launched yet): their run goes on."""
        notes = []
        for job in self.store.jobs():
            if job.spec.get("shards", 1) <= 1 or job.state not in _TAKEN_UP or job.name in self.runners:
                continue
            if not any(a.shard is not None for a in self.store.attempts(job.name)):
                continue  # never launched: `start` failed before any shard, nothing to go on with
            try:
                sharded = self.runners[job.name] = ShardedJob(JobSpec.model_validate(job.spec), self.context)
            except (ValidationError, SuperviseError) as exc:
                self.store.set_job_state(job.name, JobState.FAILED, f"not taken up again on recovery: {exc}")
                notes.append(f"{job.name}: not taken up again ({exc})")
                continue
            sharded.start({})
            notes.append(f"{job.name}: no shard was running; its run goes on")
        return notes

    def start_runner(self, spec: JobSpec, resume: AttemptRow | None = None) -> JobRunner | ShardedJob:
        if spec.shards > 1:
            try:
                sharded = ShardedJob(spec, self.context)
            except SuperviseError as exc:
                self.store.set_job_state(spec.name, JobState.FAILED, f"cannot supervise it: {exc}")
                raise
            self.runners[spec.name] = sharded
            sharded.start()
            return sharded
        try:
            runner = JobRunner(spec, self.context(spec.host))
        except SuperviseError as exc:
            # No runner will ever move this job on: its state must say so, not stay `starting`.
            self.store.set_job_state(spec.name, JobState.FAILED, f"cannot supervise it: {exc}")
            raise
        self.runners[spec.name] = runner
        runner.start(resume)
        return runner

    # -- what readers see ---------------------------------------------------------------

    def snapshot(self, job: str) -> RunnerSnapshot | None:
        """The job's runner as it stands now; None when no runner was started for it."""
        runner = self.runners.get(job)
        return runner.snapshot() if runner is not None else None

    def job_readings(self) -> list[JobReading]:
        return [JobReading(job, self.store.latest_attempt(job.name), self.snapshot(job.name), self._shard_rows(job))
                for job in self.store.jobs()]

    def shard_of(self, job: str, attempt: int) -> int | None:
        try:
            return self.store.attempt(job, attempt).shard
        except SuperviseError:  # gone (`supervise rm`): its events count for the job only
            return None

    def _shard_rows(self, job: JobRow) -> tuple[ShardRows, ...]:
        shards = job.spec.get("shards", 1)
        return tuple(shard_rows(shards, job.state, self.store.attempts(job.name))) if shards > 1 else ()

    def alert_counts(self) -> AlertCounts:
        return self.alerter.counts()

    def host_readings(self) -> list[HostReading]:
        return [HostReading(name, slot.gpu.latest, slot.host) for name, slot in self.hosts.items()]

    def _prune_on_launch(self, events: list[Event]) -> None:
        """Log retention: each launch trims its job's older logs (never a running attempt's)."""
        rule = Retention(self.settings.log_keep_attempts, self.settings.log_max_bytes)
        for job in {e.job for e in events if e.kind is EventKind.LAUNCHED}:
            attempts = self.store.attempts(job)
            pruned = prune_logs(attempts, rule)
            for p in pruned:
                log.info("log pruned", job=job, attempt=p.attempt, path=p.path, bytes=p.size)
            prune_arrivals(attempts, rule, pruned, self.paths.arrivals)
            prune_events(self.store, pruned)

    def _log_event(self, events: list[Event]) -> None:
        for event in events:
            if event.kind in _LOGGED_KINDS:
                log.info("event", job=event.job, attempt=event.attempt, kind=event.kind.value, message=event.message[:300])
