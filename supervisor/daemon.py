"""The daemon: one asyncio process supervising many jobs, with an HTTP API on a Unix socket.

Start-up runs a recovery pass (said in the log and in `supervise status`): every attempt
the store believes running is re-adopted if its pid *and* start time still match, else
finished from its exit-status file, else marked lost.  Shutdown (SIGTERM/SIGINT) detaches
from jobs without touching them — they live in their own sessions and the next daemon
re-adopts them; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ValidationError

from . import __version__, protocol
from .alerts import Alerter
from .bus import EventBus
from .config import DaemonSettings, LoadedSettings, Paths, default_paths, describe_settings, load_settings
from .errors import DaemonError, NotFound, RequestRejected, SpecError, SuperviseError
from .events import Event
from .gpu import GpuSample, NvmlSampler
from .host import Host, ProcessHandle
from .launch import LocalHost
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics, serve_tcp
from .runner import GpuView, JobRunner, RunnerContext
from .spec import JobSpec, load_spec
from .store import AttemptRow, EventQuery, Store
from .views import attempt_info, event_info, gpu_devices, job_status

log = structlog.get_logger("supervise.daemon")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class GpuMonitor:
    """Samples one host's GPUs on a steady interval; keeps the latest sample; stores some."""

    def __init__(self, host_name: str, store: Store, settings: DaemonSettings,
                 read: Callable[[], Awaitable[GpuSample]]) -> None:
        self.host_name = host_name
        self.store = store
        self.settings = settings
        self._read = read
        self.latest: GpuSample | None = None
        self._last_stored = 0.0
        self._lock = asyncio.Lock()

    async def sample(self) -> GpuSample:
        async with self._lock:  # one reading at a time per host
            sample = await self._read()
        self.latest = sample
        if sample.available and sample.ts - self._last_stored >= self.settings.gpu_store_every_s:
            self._last_stored = sample.ts
            with contextlib.suppress(SuperviseError):
                rows = [(d.index, d.used_mib, d.total_mib, d.util_pct) for d in sample.devices]
                self.store.record_gpu(self.host_name, sample.ts, rows)
        return sample

    async def run(self) -> None:
        said_off = False
        while True:
            sample = await self.sample()
            if sample.available:
                said_off = False
                await asyncio.sleep(self.settings.gpu_interval_s)
                continue
            if not said_off:
                log.info("GPU sampling is off", host=self.host_name, reason=sample.reason)
                said_off = True
            if self.host_name == "local":
                return  # no driver here will not change while the daemon runs
            # A remote box may be unreachable for a while: look again, less often.
            await asyncio.sleep(max(30.0, self.settings.gpu_interval_s))


@dataclass
class HostSlot:
    """A host and the GPU monitor that watches it: what a job on that host needs."""

    host: Host
    gpu: GpuMonitor
    task: asyncio.Task[None] | None = None


class Hosts:
    """One live connection and GPU monitor per host name (`local`, `ssh://user@box`), made on first use."""

    def __init__(self, store: Store, settings: DaemonSettings, local: Host, nvml: Any | None) -> None:
        self.store = store
        self.settings = settings
        self._slots: dict[str, HostSlot] = {}
        sampler = NvmlSampler(nvml=nvml)
        self._local_sampler = sampler
        self._slots["local"] = HostSlot(local, GpuMonitor("local", store, settings, lambda: asyncio.to_thread(sampler.sample)))

    def get(self, name: str) -> HostSlot:
        if name not in self._slots:
            self._slots[name] = self._connect(name)
        slot = self._slots[name]
        if slot.task is None:
            slot.task = asyncio.create_task(slot.gpu.run(), name=f"gpu:{name}")
        return slot

    def _connect(self, name: str) -> HostSlot:
        if not name.startswith("ssh://"):
            raise SpecError(f"unknown host '{name}': use 'local' or 'ssh://[user@]host[:port]'")
        from .ssh import SshHost

        host = SshHost(name)
        return HostSlot(host, GpuMonitor(name, self.store, self.settings, host.sample_gpus))

    @property
    def local(self) -> HostSlot:
        return self.get("local")

    def items(self) -> list[tuple[str, HostSlot]]:
        """The hosts connected so far (never connects one)."""
        return list(self._slots.items())

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.task is not None:
                slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await slot.task
            await slot.host.close()
        self._local_sampler.close()


class Daemon:
    def __init__(self, paths: Paths, settings: DaemonSettings, host: Host | None = None,
                 nvml: Any | None = None, loaded: LoadedSettings | None = None) -> None:
        self.paths = paths
        self.settings = settings
        self.loaded = loaded or LoadedSettings(settings, {}, paths.state_dir / "config.toml", False)
        paths.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(paths.db)
        self.bus = EventBus()
        local = host or LocalHost(paths.logs, poll_interval_s=settings.poll_interval_s)
        self.hosts = Hosts(self.store, settings, local, nvml)
        self.alerter = Alerter(list(settings.alert_urls), min_interval_s=settings.alert_min_interval_s)
        self.runners: dict[str, JobRunner] = {}
        self.recovery_notes: list[str] = []
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.bus.subscribe(self._log_event)
        self.metrics = Metrics(self)
        self.bus.subscribe(self.metrics.on_events)
        self._metrics_runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def context(self, host_name: str) -> RunnerContext:
        slot = self.hosts.get(host_name)
        gpu = slot.gpu
        return RunnerContext(store=self.store, bus=self.bus, host=slot.host,
                             alerter=self.alerter, gpu=GpuView(gpu.sample, lambda: gpu.latest),
                             records_seen=self.metrics.records_seen)

    def _lock(self) -> None:
        """One daemon per state directory: an advisory lock held for the daemon's lifetime."""
        self._lock_file = open(self.paths.state_dir / "daemon.lock", "w")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DaemonError(f"another daemon already runs for {self.paths.state_dir} (see {self.paths.pid_file})") from exc

    async def serve(self) -> None:
        self._lock()
        await self.hosts.local.gpu.sample()
        await self.recover()
        runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False)
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
        log.info("daemon listening", socket=str(self.paths.socket), pid=os.getpid(), version=__version__)
        try:
            await self._stopping.wait()
        finally:
            await self.shutdown(runner)

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
        await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.paths.pid_file.unlink()
        await self.hosts.close()
        self.store.close()

    async def recover(self) -> None:
        """Re-adopt, finish or mark lost every attempt the store thinks is running."""
        for row in self.store.live_attempts():
            note = await self._recover_one(row)
            self.recovery_notes.append(note)
            log.info("recovery", job=row.job, attempt=row.n, outcome=note)
        if not self.recovery_notes:
            log.info("recovery: nothing was running")

    async def _recover_one(self, row: AttemptRow) -> str:
        try:
            spec = JobSpec.model_validate(self.store.job(row.job).spec)
        except (ValidationError, SuperviseError) as exc:
            self.store.update_attempt(row.job, row.n, state="lost", reason=f"spec unreadable on recovery: {exc}")
            return f"{row.job}#{row.n}: lost (spec unreadable)"
        handle = ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                               tag=row.tag, log_path=row.log_path, status_path=row.status_path)
        if spec.host != "local":
            # A remote box may be unreachable right now: never hold up start-up for it.  The
            # runner re-adopts the attempt and its host reconnects with backoff.
            self._start_runner(spec, resume=row)
            return f"{row.job}#{row.n}: re-adopted on {spec.host} (its runner checks liveness)"
        host = self.hosts.get(spec.host).host
        alive = row.pid is not None and await host.is_alive(handle)
        status = None if alive else await host.exit_status(handle)
        if row.pid is None or (not alive and status is None and row.state == "launching"):
            self.store.update_attempt(row.job, row.n, state="lost", ended=time.time(),
                                      reason="the daemon stopped while launching it")
            self.store.set_job_state(row.job, "failed", "attempt lost during launch; start the job again")
            return f"{row.job}#{row.n}: lost during launch"
        # Alive, or ended while we were away: either way the runner drains the log from the
        # saved offset and judges it; a dead wrapper is noticed at once by wait_exit.
        self._start_runner(spec, resume=row)
        return f"{row.job}#{row.n}: {'re-adopted pid ' + str(row.pid) if alive else 'ended while the daemon was down; finishing'}"

    def _start_runner(self, spec: JobSpec, resume: AttemptRow | None = None) -> JobRunner:
        runner = JobRunner(spec, self.context(spec.host))
        self.runners[spec.name] = runner
        runner.start(resume)
        return runner

    def _log_event(self, events: list[Event]) -> None:
        for event in events:
            if event.kind.value in ("failure", "verdict", "action", "exited", "launched", "alert"):
                log.info("event", job=event.job, attempt=event.attempt, kind=event.kind.value, message=event.message[:300])

    # -- request handlers (one per route) ----------------------------------------------

    async def ping(self, request: web.Request) -> web.StreamResponse:
        return _json(protocol.PingResponse(pid=os.getpid(), version=__version__, state_dir=str(self.paths.state_dir)))

    async def start_job(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.StartRequest)
        spec = load_spec(Path(body.spec_path)).with_overrides(body.overrides)
        spec.argv(1)  # expand templates now: a missing parameter is reported before anything runs
        current = self.runners.get(spec.name)
        if current is not None and current.running:
            raise RequestRejected(f"job '{spec.name}' is already running; `supervise stop {spec.name}` first", 409)
        self.store.upsert_job(spec.name, spec.model_dump(mode="json"), "starting")
        runner = self._start_runner(spec)
        n = await _wait_for_attempt(self.store, spec.name, runner)
        row = self.store.attempt(spec.name, n)
        return _json(protocol.StartResponse(job=spec.name, attempt=n, log_path=row.log_path,
                                            message=f"started {spec.name} attempt {n} (pid {row.pid})"))

    async def stop_job(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = await _body(request, protocol.StopRequest)
        self.store.job(name)
        runner = self.runners.get(name)
        if runner is None or not runner.running:
            return _json(protocol.StopResponse(job=name, message=f"{name} is not running"))
        report = await runner.stop(body.grace_s)
        orphans = set(report.reparented)
        processes = [protocol.KilledProcess(pid=p, name=n, signal="SIGTERM", reparented=p in orphans)
                     for p, n in report.terminated]
        processes += [protocol.KilledProcess(pid=p, name=n, signal="SIGKILL", reparented=p in orphans)
                      for p, n in report.killed]
        message = f"stopped {name}: {report.summary()}"
        if report.survivors:
            raise RequestRejected(message, 500)
        return _json(protocol.StopResponse(job=name, message=message, processes=processes))

    async def status(self, request: web.Request) -> web.StreamResponse:
        only = request.query.get("job")
        rows = [self.store.job(only)] if only else self.store.jobs()
        jobs = [job_status(row, self.store, self.runners.get(row.name)) for row in rows]
        sample = self.hosts.local.gpu.latest
        return _json(protocol.StatusResponse(
            jobs=jobs, daemon_pid=os.getpid(), daemon_version=__version__,
            gpu=gpu_devices(sample), gpu_note="" if sample and sample.available else (sample.reason if sample else "not sampled yet"),
        ))

    async def jobs(self, request: web.Request) -> web.StreamResponse:
        rows = self.store.jobs()
        return _json(protocol.JobsResponse(jobs=[job_status(r, self.store, self.runners.get(r.name)) for r in rows]))

    async def attempts(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.store.job(name)
        return _json(protocol.AttemptsResponse(attempts=[attempt_info(a) for a in self.store.attempts(name)]))

    async def events(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.store.job(name)
        query = EventQuery(
            job=name, attempt=_int_query(request, "attempt"), min_attempt=_int_query(request, "min_attempt"),
            after_id=_int_query(request, "after") or 0,
            kinds=[k for k in request.query.get("kinds", "").split(",") if k] or None,
        )
        if request.query.get("follow") != "1":
            return _json(protocol.EventsResponse(events=[event_info(e) for e in self.store.query_events(query)]))
        return await self._stream_events(request, query, until_done=request.query.get("until_done") == "1")

    async def _stream_events(self, request: web.Request, query: EventQuery, until_done: bool) -> web.StreamResponse:
        sub = self.bus.stream()  # subscribe before reading the backlog: nothing falls in between
        response = await _ndjson(request)
        try:
            backlog = self.store.query_events(query)
            for event in backlog:
                await _write_line(response, event_info(event))
            if backlog:
                query = replace(query, after_id=backlog[-1].id or query.after_id)
            while True:
                try:
                    batch = await asyncio.wait_for(sub.queue.get(), timeout=0.5)
                except TimeoutError:
                    runner = self.runners.get(query.job)
                    if until_done and sub.queue.empty() and (runner is None or not runner.running):
                        break
                    continue
                if batch is None:
                    break
                for event in batch:
                    if query.matches(event):
                        await _write_line(response, event_info(event))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            sub.close()
        return response

    async def logs(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.store.job(name)
        n = _int_query(request, "attempt")
        row = self.store.attempt(name, n) if n else self.store.latest_attempt(name)
        if row is None:
            raise NotFound(f"job '{name}' has no attempts yet")
        follow = request.query.get("follow") == "1"
        response = await _ndjson(request)
        follower = self.hosts.get(row.host).host.follow(row.log_path, _int_query(request, "offset") or 0)
        ender = asyncio.create_task(self._finish_when_ended(row, follower, follow))
        partial = getattr(follower, "partial_text", None)  # followers that can show an unterminated tail
        try:
            async for batch in follower.records():
                for record in batch:
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=record.offset,
                                                                 text=record.text, redraw=record.redraw))
                tail = partial() if partial is not None else ""
                if tail:
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text=tail,
                                                                 redraw=True, partial=True))
            await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text="", end=True))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            ender.cancel()
            await follower.aclose()
        return response

    async def _finish_when_ended(self, row: AttemptRow, follower: Any, follow: bool) -> None:
        if follow:
            while self.store.attempt(row.job, row.n).state in ("launching", "running"):
                await asyncio.sleep(0.25)
        follower.finish()

    async def gpus(self, request: web.Request) -> web.StreamResponse:
        monitor = self.hosts.get(request.query.get("host", "local")).gpu
        sample = monitor.latest or await monitor.sample()
        return _json(protocol.GpusResponse(available=sample.available, note=sample.reason, devices=gpu_devices(sample)))

    async def job_gpu(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        job = self.store.job(name)
        attempts = self.store.attempts(name)
        host = job.spec.get("host", "local")
        since = attempts[0].started if attempts else job.created
        live = any(a.ended is None for a in attempts)
        until = time.time() if live or not attempts else max(a.ended or a.started for a in attempts)
        samples = [protocol.GpuSampleInfo(ts=ts, gpu=gpu, used_mib=used, total_mib=total)
                   for ts, gpu, used, total in self.store.gpu_history(host, since) if ts <= until]
        return _json(protocol.JobGpuResponse(job=name, host=host, since=since, until=until, samples=samples))

    async def config(self, request: web.Request) -> web.StreamResponse:
        return _json(describe_settings(self.loaded))

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=await self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(openapi_schema())


# -- HTTP plumbing -----------------------------------------------------------------------

ROUTES: list[tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None]] = [
    ("GET", "/v1/ping", "ping", None, protocol.PingResponse),
    ("POST", "/v1/jobs", "start_job", protocol.StartRequest, protocol.StartResponse),
    ("GET", "/v1/jobs", "jobs", None, protocol.JobsResponse),
    ("POST", "/v1/jobs/{name}/stop", "stop_job", protocol.StopRequest, protocol.StopResponse),
    ("GET", "/v1/status", "status", None, protocol.StatusResponse),
    ("GET", "/v1/jobs/{name}/attempts", "attempts", None, protocol.AttemptsResponse),
    ("GET", "/v1/jobs/{name}/events", "events", None, protocol.EventsResponse),
    ("GET", "/v1/jobs/{name}/log", "logs", None, protocol.LogChunk),
    ("GET", "/v1/gpus", "gpus", None, protocol.GpusResponse),
    ("GET", "/v1/jobs/{name}/gpu", "job_gpu", None, protocol.JobGpuResponse),
    ("GET", "/v1/config", "config", None, protocol.ConfigResponse),
]


def build_app(daemon: Daemon) -> web.Application:
    app = web.Application(middlewares=[_errors_middleware])
    for method, path, handler_name, _, _ in ROUTES:
        app.router.add_route(method, path, getattr(daemon, handler_name))
    app.router.add_get("/openapi.json", daemon.openapi)
    app.router.add_get("/metrics", daemon.metrics_endpoint)  # Prometheus text format
    return app


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except RequestRejected as exc:
        return _error(str(exc), exc.status)
    except NotFound as exc:
        return _error(str(exc), 404)
    except SpecError as exc:
        return _error(str(exc), 422)
    except SuperviseError as exc:
        return _error(str(exc), 400)
    except Exception as exc:  # a bug in one request must not take the daemon down
        log.exception("request failed", path=request.path)
        return _error(f"internal error: {exc!r} (see the daemon log)", 500)


def _error(message: str, status: int) -> web.Response:
    return web.json_response(protocol.ErrorBody(error=message).model_dump(), status=status)


def _json(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


async def _body(request: web.Request, model: type[Any]) -> Any:
    try:
        raw = await request.read()
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise RequestRejected(f"bad request body: {exc.errors()[0]['msg']}", 400) from exc


def _int_query(request: web.Request, key: str) -> int | None:
    value = request.query.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise RequestRejected(f"query parameter {key} must be an integer", 400) from exc


async def _ndjson(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    return response


async def _write_line(response: web.StreamResponse, model: BaseModel) -> None:
    await response.write(model.model_dump_json().encode() + b"\n")


async def _wait_for_attempt(store: Store, job: str, runner: JobRunner) -> int:
    """Wait until the runner has launched (or failed to launch) the job's new attempt."""
    before = store.latest_attempt(job)
    previous = before.n if before else 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        latest = store.latest_attempt(job)
        if latest is not None and latest.n > previous and latest.state != "launching":
            return latest.n
        if not runner.running:
            raise RequestRejected(f"could not start {job}: {store.job(job).reason}", 500)
        await asyncio.sleep(0.02)
    raise RequestRejected(f"{job} did not launch within 60s (waiting for GPUs?): `supervise status {job}`", 504)


def openapi_schema() -> dict[str, Any]:
    """An OpenAPI 3.1 document generated from the route table and the protocol models."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {"ErrorBody": protocol.ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")}
    for method, path, handler_name, request_model, response_model in ROUTES:
        operation: dict[str, Any] = {"operationId": handler_name, "responses": {
            "default": {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}}}
        for model, slot in ((request_model, "request"), (response_model, "response")):
            if model is None:
                continue
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            if slot == "request":
                operation["requestBody"] = ref
            else:
                operation["responses"]["200"] = {"description": "ok", **ref}
        params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in ("name",) if "{" + p + "}" in path]
        if params:
            operation["parameters"] = params
        paths.setdefault(path, {})[method.lower()] = operation
    return {"openapi": "3.1.0", "info": {"title": "supervise daemon", "version": __version__}, "paths": paths,
            "components": {"schemas": schemas}}


# -- process entry -----------------------------------------------------------------------

def configure_logging() -> None:
    renderer: Any = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(processors=[
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.processors.format_exc_info,
        renderer,
    ], logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def run_daemon(paths: Paths | None = None) -> int:
    configure_logging()
    paths = paths or default_paths()
    loaded = load_settings(paths)
    return asyncio.run(_main(paths, loaded.settings, loaded))


async def _main(paths: Paths, settings: DaemonSettings, loaded: LoadedSettings | None = None) -> int:
    loop = asyncio.get_running_loop()
    daemon = Daemon(paths, settings, loaded=loaded)
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:  # a second Ctrl-C: the user wants out now
            log.warning("second signal: exiting immediately")
            os._exit(130)
        log.info("signal received: shutting down", signal=signal.Signals(signum).name)
        daemon.request_stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await daemon.serve()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0


def main() -> None:
    try:
        code = run_daemon()
    except SuperviseError as exc:  # bad configuration, another daemon running: one line, its exit code
        print(f"supervise daemon: {exc}", file=sys.stderr)
        code = exc.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()

