"""The route handlers (one per route), the route table built from them, and the application that
serves them."""

from __future__ import annotations

import asyncio
import os
import time
import types
from dataclasses import replace
from pathlib import Path

import structlog
from aiohttp import web

from supervisor import __version__
from supervisor.core import protocol
from supervisor.core.config import config_changed, describe_settings
from supervisor.core.errors import NotFound, RequestRejected, shown
from supervisor.core.host_url import LOCAL_HOST
from supervisor.daemon import streams as _streams
from supervisor.daemon.api._http import (
    EVENTS_PAGE,
    REQUEST_TIMEOUT,
    _body,
    _checked_name,
    _cut,
    _errors_middleware,
    _int_query,
    _json,
    _ndjson,
    _path_name,
    _write_line,
)
from supervisor.daemon.api._openapi import openapi_schema
from supervisor.daemon.api._routes import Route
from supervisor.daemon.api._service import Service
from supervisor.daemon.api._specs import (
    check_hosts,
    reloaded_spec,
    restart_note,
    start_notes,
    stored_spec,
    validated_spec,
)
from supervisor.daemon.api._stacks import job_stacks
from supervisor.daemon.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from supervisor.hosts.base import Follower
from supervisor.hosts.refollow import FollowThroughOutages
from supervisor.jobs.quarantine import check_place, quarantine_infos, resolve_place
from supervisor.jobs.views import attempt_info, event_info, gpu_devices, job_statuses
from supervisor.probes import load_packs
from supervisor.spec.command_check import check_local_command
from supervisor.spec.model import JobSpec
from supervisor.store import arrivals
from supervisor.store.database import AttemptRow, EventQuery

log = structlog.get_logger("supervise.api")

class Api:
    """The route handlers, bound to one running service."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def ping(self, request: web.Request) -> web.StreamResponse:
        return _json(protocol.PingResponse(pid=os.getpid(), version=__version__, state_dir=str(self.service.paths.state_dir)))

    async def start_job(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.StartRequest)
        spec = await validated_spec(body, self.service.hosts)
        self.service.jobs.refuse_start(spec)
        notes = await self._start_notes(spec)
        response = await self.service.jobs.launch(spec)
        return _json(response.model_copy(update={"notes": notes + response.notes}))

    async def _start_notes(self, spec: JobSpec) -> list[str]:
        try:
            stored = self.service.store.job(spec.name).stored
        except NotFound:
            stored = None  # a new job
        # In a thread: a spec may be up to 1 MiB (comparing two such is slow), packs are files.
        return await asyncio.to_thread(start_notes, spec, stored)

    async def start_pipeline(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.PipelineStartRequest)
        _checked_name(body.spec_path, "spec_path")
        return _json(await self.service.jobs.pipelines.start(body))

    async def stop_job(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.StopRequest)
        return _json(await self.service.jobs.stop(request.match_info["name"], body.grace_s))

    async def status(self, request: web.Request) -> web.StreamResponse:
        only = _checked_name(request.query.get("job", ""), "query parameter job") or None
        jobs, pipelines = self.service.jobs.status(only)
        sample = self.service.hosts.local.gpu.latest
        return _json(protocol.StatusResponse(
            jobs=jobs, daemon_pid=os.getpid(), daemon_version=__version__,
            gpu=gpu_devices(sample), gpu_note="" if sample and sample.available else (sample.reason if sample else "not sampled yet"),
            pipelines=pipelines, web_note=self.service.web.problem or "",
            quarantined=quarantine_infos(self.service.quarantines.active()),
        ))

    async def jobs(self, request: web.Request) -> web.StreamResponse:
        rows = self.service.store.jobs()
        return _json(protocol.JobsResponse(jobs=job_statuses(rows, self.service.store, self.service.jobs.snapshot)))

    async def job_names(self, request: web.Request) -> web.StreamResponse:
        return _json(protocol.JobNamesResponse(names=self.service.store.job_names()))

    async def attempts(self, request: web.Request) -> web.StreamResponse:
        name = _path_name(request)
        self.service.store.job(name)
        return _json(protocol.AttemptsResponse(attempts=[attempt_info(a) for a in self.service.store.attempts(name)]))

    async def events(self, request: web.Request) -> web.StreamResponse:
        name = _path_name(request)
        self.service.store.job(name)
        query = EventQuery(
            job=name, attempt=_int_query(request, "attempt"), min_attempt=_int_query(request, "min_attempt"),
            after_id=_int_query(request, "after") or 0,
            kinds=[k for k in request.query.get("kinds", "").split(",") if k] or None,
        )
        if request.query.get("follow") != "1":
            limit = _int_query(request, "limit", 1, EVENTS_PAGE) or EVENTS_PAGE
            return _json(protocol.EventsResponse(events=[event_info(e) for e in self.service.store.query_events(query, limit)]))
        return await self._stream_events(request, query, until_done=request.query.get("until_done") == "1")

    async def _stream_events(self, request: web.Request, query: EventQuery, until_done: bool) -> web.StreamResponse:
        sub = self.service.bus.stream()  # subscribe before reading the backlog: nothing falls in between
        response = await _ndjson(request)
        try:
            while True:  # the whole backlog, a page at a time
                backlog = self.service.store.query_events(query, EVENTS_PAGE)
                for event in backlog:
                    await _write_line(response, event_info(event))
                if backlog:
                    query = replace(query, after_id=backlog[-1].id or query.after_id)
                if len(backlog) < EVENTS_PAGE:
                    break
            while True:
                # Checked on every batch, not only when the bus is quiet: other jobs' events must
                # not keep a follower of an ended job waiting.  The runner publishes its last
                # events before it counts as ended, so they are queued by then.
                ended = until_done and self.service.jobs.ended(query.job)
                try:
                    batch = sub.queue.get_nowait() if ended else await asyncio.wait_for(sub.queue.get(), timeout=0.5)
                except (TimeoutError, asyncio.QueueEmpty):
                    if ended or _streams.client_gone(request):  # a quiet stream writes nothing to notice it
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
        name = _path_name(request)
        n = _int_query(request, "attempt")
        offset = _int_query(request, "offset") or 0  # checked before the stream starts: a bad one is a 400
        self.service.store.job(name)
        row = self.service.store.attempt(name, n) if n else self.service.store.latest_attempt(name)
        if row is None:
            raise NotFound(f"job '{name}' has no attempts yet")
        follow = request.query.get("follow") == "1"
        stamp = await arrivals.stamper(self.service.paths.arrivals, row) if request.query.get("timestamps") == "1" else None
        response = await _ndjson(request)
        # Shown, not judged: a box that cannot be reached for a while pauses the stream, not ends it.
        follower = FollowThroughOutages(self.service.hosts.get(row.host).host, row.log_path, offset)
        ender = asyncio.create_task(self._finish_when_ended(request, row, follower, follow))
        try:
            async for batch in follower.records():
                for record in batch:
                    # Dated by its text's last byte, not by its terminator: tqdm writes each redraw's `\r`
                    # before its text, so a redraw's terminator comes with the next redraw, a step later.
                    ts = stamp and stamp(record.end - 1 if not record.cut else record.end)
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=record.offset, text=record.text,
                                                                 redraw=record.redraw, ts=ts))
                tail = follower.partial_text()
                if tail:
                    # Dated as its record will be, by its text's last byte (the bytes held are the text,
                    # or the text and a trailing `\r`).
                    ts = stamp and stamp(follower.offset + follower.buffered - 1)
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text=tail,
                                                                 redraw=True, partial=True, ts=ts))
            await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text="", end=True))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            ender.cancel()
            await follower.aclose()
        return response

    async def _finish_when_ended(self, request: web.Request, row: AttemptRow, follower: Follower, follow: bool) -> None:
        if follow:
            await self.service.jobs.attempt_ended(row.job, row.n, lambda: _streams.client_gone(request))
        follower.finish()

    async def gpus(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("host", LOCAL_HOST)
        slot = self.service.hosts.find(name)
        if slot is None:  # never make a slot for a request: each would hold a connection and a sampler
            in_use = ", ".join(n for n, _ in self.service.hosts.items())
            raise RequestRejected(f"no job runs on host {_cut(name)}: GPUs are sampled on hosts in use only ({in_use})", 400)
        monitor = slot.gpu
        sample = monitor.latest or await monitor.sample()
        return _json(protocol.GpusResponse(available=sample.available, note=sample.reason, devices=gpu_devices(sample)))

    async def job_gpu(self, request: web.Request) -> web.StreamResponse:
        name = _path_name(request)
        job = self.service.store.job(name)
        attempts = self.service.store.attempts(name)
        host = job.host
        since = attempts[0].started if attempts else job.created
        live = any(a.ended is None for a in attempts)
        until = time.time() if live or not attempts else max(a.ended or a.started for a in attempts)
        samples = [protocol.GpuSampleInfo(ts=ts, gpu=gpu, used_mib=used, total_mib=total)
                   for ts, gpu, used, total in self.service.store.gpu_history(host, since) if ts <= until]
        return _json(protocol.JobGpuResponse(job=name, host=host, since=since, until=until, samples=samples))

    async def config(self, request: web.Request) -> web.StreamResponse:
        response = describe_settings(self.service.loaded)
        response.changed_since_start = config_changed(self.service.loaded)
        # Whether the file is there now (the settings are the start's): one written since the start
        # read "(absent)" beside the note that it changed.
        response.config_file_exists = await asyncio.to_thread(Path(response.config_file).is_file)
        return _json(response)

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=await self.service.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def web_page(self, request: web.Request) -> web.StreamResponse:
        return _json(await self.service.web.configure(await _body(request, protocol.WebRequest)))

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(openapi_schema(ROUTES))

    async def restart_job(self, request: web.Request) -> web.StreamResponse:
        """Stop the job if it runs, then start it with its stored spec (overrides included)."""
        name = request.match_info["name"]
        body = await _body(request, protocol.RestartRequest)
        row = self.service.store.job(name)
        spec, stored = stored_spec(row), row.stored
        if body.reload:  # the file as it is now: a bad one is refused before the job is stopped
            spec = await asyncio.to_thread(reloaded_spec, spec, body.fields)
            check_hosts(spec, self.service.hosts)
        elif body.fields.given():  # `restart --shards 4`: the stored spec changed, checked before the job is stopped
            spec = spec.with_overrides({}, body.fields)
            check_hosts(spec, self.service.hosts)
        load_packs(spec.probes, spec.probe_files)  # a pack gone since: refused before the job is stopped
        await asyncio.to_thread(check_local_command, spec)  # so is a command gone since
        # Never silently: a spec file edited since the start is either taken (--reload) or said to be left.
        note = await asyncio.to_thread(restart_note, spec, stored, reloaded=body.reload)
        response = await self.service.jobs.restart(spec, body.grace_s)
        if note is None:
            return _json(response)
        started = response.started.model_copy(update={"notes": [note, *response.started.notes]})
        return _json(response.model_copy(update={"started": started}))

    async def remove_job(self, request: web.Request) -> web.StreamResponse:
        """Forget a job that is not running; its attempt logs stay unless ?logs=1."""
        return _json(await self.service.jobs.remove(request.match_info["name"], logs=request.query.get("logs") == "1"))

    async def prune(self, request: web.Request) -> web.StreamResponse:
        """Apply the log retention settings now, to one job (?job=) or all."""
        return _json(self.service.jobs.prune(request.query.get("job")))

    async def stop_daemon(self, request: web.Request) -> web.StreamResponse:
        """Exit once this answer is sent; the jobs keep running and the next daemon re-adopts them."""
        asyncio.get_running_loop().call_later(0.05, self.service.request_stop)
        running = self.service.jobs.running_count()
        return _json(protocol.DaemonStopResponse(
            pid=os.getpid(), message=f"daemon (pid {os.getpid()}) stopped; {running} running job(s) keep running "
                                     "and the next daemon re-adopts them"))

    async def hold_job(self, request: web.Request) -> web.StreamResponse:
        """Postpone any kill of a running job until `release` (a pending one included)."""
        return _json(self.service.jobs.hold(request.match_info["name"], hold=True))

    async def release_job(self, request: web.Request) -> web.StreamResponse:
        """Let kills come again; a pending kill counts down again from now."""
        return _json(self.service.jobs.hold(request.match_info["name"], hold=False))

    async def job_stacks(self, request: web.Request) -> web.StreamResponse:
        return _json(await job_stacks(self.service, _path_name(request)))

    async def quarantine(self, request: web.Request) -> web.StreamResponse:
        """The GPUs and hosts jobs are kept away from now, each with its expiry."""
        return _json(protocol.QuarantineResponse(quarantined=quarantine_infos(self.service.quarantines.active())))

    async def clear_quarantine(self, request: web.Request) -> web.StreamResponse:
        """Lift a quarantine now: HOST (the host's and its GPUs') or HOST:GPU."""
        body = await _body(request, protocol.QuarantineClearRequest)
        quarantines = self.service.quarantines
        try:
            place = check_place(body.place)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from None
        held = quarantines.active()
        named = resolve_place(place, held)
        if named is None:
            listed = ", ".join(q.place for q in held) or "none"
            raise NotFound(f"nothing quarantined at {shown(place)} (quarantined now: {listed}); "
                           "`supervise quarantine` lists them")
        removed = await quarantines.clear(*named)
        what = named[0] if named[1] is None else f"{named[0]}:{named[1]}"
        return _json(protocol.QuarantineResponse(quarantined=quarantine_infos(quarantines.active()),
                                                 message=f"quarantine of {what} lifted ({removed} entr"
                                                         f"{'y' if removed == 1 else 'ies'}); jobs may launch there again"))


# The route table: each route names its handler itself (a route to a handler that does not exist cannot be
# written), and the app and the OpenAPI document are both made from it.
ROUTES: list[Route] = [
    Route("GET", "/v1/ping", Api.ping, None, protocol.PingResponse),
    Route("POST", "/v1/jobs", Api.start_job, protocol.StartRequest, protocol.StartResponse),
    Route("GET", "/v1/jobs", Api.jobs, None, protocol.JobsResponse),
    Route("GET", "/v1/job-names", Api.job_names, None, protocol.JobNamesResponse),
    Route("POST", "/v1/jobs/{name}/stop", Api.stop_job, protocol.StopRequest, protocol.StopResponse),
    Route("GET", "/v1/status", Api.status, None, protocol.StatusResponse),
    Route("GET", "/v1/jobs/{name}/attempts", Api.attempts, None, protocol.AttemptsResponse),
    Route("GET", "/v1/jobs/{name}/events", Api.events, None, protocol.EventsResponse),
    Route("GET", "/v1/jobs/{name}/log", Api.logs, None, protocol.LogChunk),
    Route("GET", "/v1/gpus", Api.gpus, None, protocol.GpusResponse),
    Route("GET", "/v1/jobs/{name}/gpu", Api.job_gpu, None, protocol.JobGpuResponse),
    Route("GET", "/v1/config", Api.config, None, protocol.ConfigResponse),
    Route("POST", "/v1/web", Api.web_page, protocol.WebRequest, protocol.WebResponse),
    Route("POST", "/v1/jobs/{name}/restart", Api.restart_job, protocol.RestartRequest, protocol.RestartResponse),
    Route("DELETE", "/v1/jobs/{name}", Api.remove_job, None, protocol.RemoveResponse),
    Route("POST", "/v1/prune", Api.prune, None, protocol.PruneResponse),
    Route("POST", "/v1/daemon/stop", Api.stop_daemon, None, protocol.DaemonStopResponse),
    Route("POST", "/v1/jobs/{name}/hold", Api.hold_job, None, protocol.HoldResponse),
    Route("POST", "/v1/jobs/{name}/release", Api.release_job, None, protocol.HoldResponse),
    Route("GET", "/v1/jobs/{name}/stacks", Api.job_stacks, None, protocol.StacksResponse),
    Route("POST", "/v1/pipelines", Api.start_pipeline, protocol.PipelineStartRequest, protocol.PipelineStartResponse),
    Route("GET", "/v1/quarantine", Api.quarantine, None, protocol.QuarantineResponse),
    Route("POST", "/v1/quarantine/clear", Api.clear_quarantine, protocol.QuarantineClearRequest,
          protocol.QuarantineResponse),
]


def build_app(service: Service) -> web.Application:
    handlers = Api(service)
    app = web.Application(middlewares=[_errors_middleware])
    app[REQUEST_TIMEOUT] = service.settings.request_timeout_s
    _streams.track(app)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, types.MethodType(route.handler, handlers))
    app.router.add_get("/openapi.json", handlers.openapi)
    app.router.add_get("/metrics", handlers.metrics_endpoint)  # Prometheus text format
    return app
