"""The daemon's service lifecycle: start-up, the recovery pass, shutdown; the jobs themselves are
the ``Supervisor``'s (jobs.py).

Start-up runs a recovery pass (recovery.py) (said in the log and in `supervise status`): every attempt
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
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from supervisor import __version__
from supervisor.core.bus import EventBus
from supervisor.core.config import DaemonSettings, LoadedSettings, Paths
from supervisor.core.errors import DaemonError, SuperviseError
from supervisor.core.events import Event, EventKind
from supervisor.core.filemodes import secure_state_dir
from supervisor.daemon.api import build_app
from supervisor.daemon.gpu_faults import GpuRouter
from supervisor.daemon.metrics import HostReading, JobReading, Metrics, serve_tcp
from supervisor.daemon.web import WebUi
from supervisor.hosts.base import Host
from supervisor.hosts.local import cgroup
from supervisor.hosts.local.host import LocalHost
from supervisor.hosts.registry import Hosts
from supervisor.jobs.owner import Supervisor
from supervisor.jobs.quarantine import QuarantineRules, Quarantines
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner import GpuView, RunnerContext
from supervisor.jobs.shard_views import ShardRows, shard_rows
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.notify.alerts import AlertCounts, Alerter
from supervisor.store.database import JobRow, Store
from supervisor.store.retention import Retention, prune_arrivals, prune_events, prune_logs

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
        self.recorder = Recorder(self.store, self.bus)  # every event and job state: stored, then published
        # GPUs and hosts kept away from (stored: a restart keeps them).
        self.quarantines = Quarantines(self.store, QuarantineRules(settings.quarantine_gpu_s, settings.quarantine_host_s,
                                                                   settings.quarantine_strikes))
        local = host or LocalHost(paths.logs, poll_interval_s=settings.poll_interval_s, nvml=nvml,
                                   kernel_log=settings.kernel_log or None,
                                   containment=cgroup.detect(base=Path(settings.cgroup_root) if settings.cgroup_root else None))
        # GPU samples and faults go to the attempts using those GPUs (and faults to the metrics).
        self.hosts = Hosts(self.store, settings, local, on_sample=lambda *sampled: self._gpu_router(*sampled))
        self.alerter = Alerter(list(settings.alert_urls), min_interval_s=settings.alert_min_interval_s)
        retention = Retention(self.loaded.settings.log_keep_attempts, self.loaded.settings.log_max_bytes)
        self.jobs = Supervisor(self.recorder, self.hosts, self.context, retention, paths.arrivals)
        self.recovery_notes: list[str] = []
        self.down_since: float | None = None  # the previous daemon's last heartbeat (what re-adoptions say)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.bus.subscribe(self._log_event)
        self.bus.subscribe(self._prune_on_launch)
        self.metrics = Metrics(self)  # reads job_readings() and host_readings()
        self.bus.subscribe(self.metrics.on_events)
        self._gpu_router = GpuRouter(lambda: self.jobs.runners.values(), self.metrics, self.quarantines)
        self._metrics_runner: web.AppRunner | None = None
        self.web = WebUi(self)  # off until `supervise web`; then back at every start (state_dir/web.json)

    # -- lifecycle ---------------------------------------------------------------------

    def context(self, host_name: str) -> RunnerContext:
        slot = self.hosts.get(host_name)
        gpu = slot.gpu
        return RunnerContext(store=self.store, bus=self.bus, recorder=self.recorder, host=slot.host,
                             alerter=self.alerter, gpu=GpuView(gpu.sample, lambda: gpu.latest, gpu.next_sample),
                             records_seen=self.metrics.records_seen, down_since=self.down_since,
                             arrivals=self.paths.arrivals, events_per_attempt=self.settings.events_per_attempt,
                             notify_dir=self.paths.notify if slot.host is self.hosts.local.host else None,
                             quarantines=self.quarantines, context_for=self.context)

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
        self.recovery_notes = await self.jobs.recover()  # and the jobs waiting for their `after`
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
        log.info("daemon stopping: jobs keep running and will be re-adopted", jobs=len(self.jobs.runners))
        await self.jobs.detach_all()
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

    # -- what readers see ---------------------------------------------------------------

    def snapshot(self, job: str) -> RunnerSnapshot | None:
        """The job's runner as it stands now; None when no runner was started for it."""
        return self.jobs.snapshot(job)

    def job_readings(self) -> list[JobReading]:
        return [JobReading(job, self.store.latest_attempt(job.name), self.snapshot(job.name), self._shard_rows(job))
                for job in self.store.jobs()]

    def shard_of(self, job: str, attempt: int) -> int | None:
        try:
            return self.store.attempt(job, attempt).shard
        except SuperviseError:  # gone (`supervise rm`): its events count for the job only
            return None

    def _shard_rows(self, job: JobRow) -> tuple[ShardRows, ...]:
        shards = job.shards
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
