"""The route handlers (one per route), the route table and the application that serves them."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path

import structlog
from aiohttp import web

from .. import __version__, arrivals, protocol
from .. import streams as _streams
from ..command_check import check_local_command
from ..config import config_changed, describe_settings
from ..dependencies import check_after
from ..errors import AlreadyRunning, ConnectionLost, HostError, HostRefused, NotFound, RequestRejected
from ..events import JobState
from ..gpu_holders import attempt_pids, still_held
from ..gpu_holders import describe as describe_held
from ..hosts.base import Follower, KillReport
from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..pending_writes import when_free
from ..probes import load_packs
from ..retention import Retention, prune_events, prune_logs, remove_logs
from ..spec import JobSpec
from ..store import AttemptRow, EventQuery
from ..strays import StrayStop, merge_reports, stop_strays, stray_handle
from ..views import attempt_info, event_info, gpu_devices, job_status
from ._http import (
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
from ._openapi import openapi_schema
from ._routes import ROUTES
from ._service import Service
from ._stacks import job_stacks
from ._specs import check_hosts, start_notes, stored_spec, validated_spec
from ._starting import gpu_wait, wait_for_attempt

log = structlog.get_logger("supervise.api")

# A verb's write waits this long for a lock another process holds, then answers "store busy" (74).
_VERB_STORE_WAIT_S = 2.0



# A pipeline step in one of these is stopped with its pipeline: it runs, or waits to.
_UNENDED = frozenset({JobState.STARTING, JobState.WAITING, JobState.RUNNING, JobState.UNREACHABLE, JobState.BACKOFF})


class Api:
    """The route handlers, bound to one running service."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def ping(self, request: web.Request) -> web.StreamResponse:
        return _json(protocol.PingResponse(pid=os.getpid(), version=__version__, state_dir=str(self.service.paths.state_dir)))

    async def start_job(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.StartRequest)
        spec = await validated_spec(body, self.service.hosts)
        current = self.service.runners.get(spec.name)
        if current is not None and current.running:
            raise AlreadyRunning(f"job '{spec.name}' is already running; `supervise stop {spec.name}` first")
        check_after(self.service.store, {spec.name: spec.after})
        notes = await self._start_notes(spec)
        response = await self._launch(spec)
        return _json(response.model_copy(update={"notes": notes + response.notes}))

    async def _start_notes(self, spec: JobSpec) -> list[str]:
        try:
            stored = self.service.store.job(spec.name).spec
        except NotFound:
            stored = None  # a new job
        # In a thread: a spec may be up to 1 MiB (comparing two such is slow), packs are files.
        return await asyncio.to_thread(start_notes, spec, stored)

    async def start_pipeline(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, protocol.PipelineStartRequest)
        _checked_name(body.spec_path, "spec_path")
        return _json(await self.service.pipelines.start(body))

    async def _launch(self, spec: JobSpec) -> protocol.StartResponse:
        await when_free(lambda: self.service.store.upsert_job(spec.name, spec.model_dump(mode="json"), JobState.STARTING),
                        within_s=_VERB_STORE_WAIT_S)
        first = self.service.store.next_attempt_number(spec.name)  # this run's first: its shards number on from it
        runner = self.service.start_runner(spec)
        n = await wait_for_attempt(self.service.store, spec.name, runner)
        if n == 0 and (waiting := gpu_wait(runner)) is not None:
            # Said at once, never after a silent minute; `--follow` follows the attempt that waits.
            return protocol.StartResponse(job=spec.name, attempt=self.service.store.next_attempt_number(spec.name),
                                          log_path="", message=f"{spec.name}: {waiting}")
        if n == 0:  # held by its `after`
            job = self.service.store.job(spec.name)
            return protocol.StartResponse(job=spec.name, attempt=0, log_path="", message=f"{spec.name} {job.state}: {job.reason}",
                                          held=job.state)
        row = self.service.store.attempt(spec.name, n)
        if spec.shards > 1:  # the attempt seen first may be any shard's: say the run's range, not its pid
            message = (f"started {spec.name}: {spec.shards} shards, attempts from {first} "
                       f"(`supervise status {spec.name}` shows each)")
        else:
            message = f"started {spec.name} attempt {n} (pid {row.pid})"
        return protocol.StartResponse(job=spec.name, attempt=n, log_path=row.log_path, message=message)

    async def stop_job(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = await _body(request, protocol.StopRequest)
        if (pipeline := self._pipeline_only(name)) is not None:
            return _json(await self._stop_pipeline(pipeline, body.grace_s))
        stopped = await self._stop(name, body.grace_s)
        return _json(stopped or protocol.StopResponse(job=name, message=f"{name} is not running"))

    def _pipeline_only(self, name: str) -> protocol.PipelineStatus | None:
        """The pipeline of that name when no job has it (`status NAME` reads the same way)."""
        try:
            self.service.store.job(name)
            return None
        except NotFound:
            found = self.service.pipelines.statuses(name)
            if not found:
                raise
            return found[0]

    async def _stop_pipeline(self, pipeline: protocol.PipelineStatus, grace_s: float | None) -> protocol.StopResponse:
        """Stop a pipeline: its running step, and every step still to come (they wait for it), so
        that nothing of it launches afterwards."""
        said, processes = [], []
        for step in pipeline.steps:
            if step.state not in _UNENDED:
                continue
            stopped = await self._stop(step.job, grace_s)
            if stopped is not None:
                said.append(f"{step.step}: {stopped.message.removeprefix(f'stopped {step.job}: ')}")
                processes += stopped.processes
                continue
            # A step still waiting for the one before it: it must never launch now.
            if (runner := self.service.runners.get(step.job)) is not None:
                await runner.stop(grace_s)
            if self.service.store.job(step.job).state in _UNENDED:
                reason = f"stopped with pipeline {pipeline.name} before it launched"
                await when_free(lambda job=step.job, why=reason: self.service.store.set_job_state(job, JobState.STOPPED, why),
                                within_s=_VERB_STORE_WAIT_S)
            said.append(f"{step.step}: not launched")
        message = (f"stopped pipeline {pipeline.name}: " + "; ".join(said) if said
                   else f"pipeline {pipeline.name} is not running")
        return protocol.StopResponse(job=pipeline.name, message=message, processes=processes)

    async def _stop(self, name: str, grace_s: float | None) -> protocol.StopResponse | None:
        """Stop the job's runner, and every attempt still alive whatever the job's state says
        (strays.py); None when nothing ran."""
        job = self.service.store.job(name)
        runner = self.service.runners.get(name)
        running = runner is not None and runner.running
        before = self.service.snapshot(name)  # the pids the runner saw: NVML may list them after the kill
        unended = [stray_handle(row) for row in self.service.store.attempts(name) if row.pid and row.state.active]
        report = await runner.stop(grace_s) if runner is not None and running else KillReport()
        spec = JobSpec.model_validate(job.spec)
        strays = StrayStop()
        for host in dict.fromkeys([spec.host, *spec.hosts]):  # a sharded job's shards run on several
            try:
                found = await stop_strays(self.service.store, self.service.hosts.get(host).host, name,
                                          None, spec.stop_grace_s if grace_s is None else grace_s)
            except (ConnectionLost, HostRefused) as exc:
                raise HostError(f"cannot reach {host} to stop {name} ({exc}); its supervision is stopped, its process "
                                f"may still run there: `supervise stop {name}` again once the host answers") from exc
            strays.attempts += found.attempts
            strays.events += found.events
            merge_reports(strays.report, found.report)
        self.service.bus.publish(strays.events)
        if not running and not strays.attempts:
            return None
        merge_reports(report, strays.report)
        slot = self.service.hosts.get(spec.host)  # GPU memory still held: looked for on the job's own host
        pids = await attempt_pids(slot.host, unended, report, before.known_pids if before else ())
        held = await still_held(slot.gpu.sample, pids)
        if strays.attempts and not running:
            await when_free(lambda: self.service.store.set_job_state(name, JobState.STOPPED, "stopped by user (it was running unwatched)"),
                            within_s=_VERB_STORE_WAIT_S)
        orphans = set(report.reparented)
        processes = [protocol.KilledProcess(pid=p, name=n, signal="SIGTERM", reparented=p in orphans)
                     for p, n in report.terminated]
        processes += [protocol.KilledProcess(pid=p, name=n, signal="SIGKILL", reparented=p in orphans)
                      for p, n in report.killed]
        message = f"stopped {name}: {report.summary()}"
        if held:  # a stop that leaves GPU memory held has not freed what it was for
            message += f"; GPU memory STILL HELD: {describe_held(held, report)}"
        if report.survivors or held:
            raise RequestRejected(message, 500)
        return protocol.StopResponse(job=name, message=message, processes=processes)

    async def status(self, request: web.Request) -> web.StreamResponse:
        only = _checked_name(request.query.get("job", ""), "query parameter job") or None
        pipelines = self.service.pipelines.statuses(only)
        if only and pipelines:  # a pipeline's name: it and its steps' jobs
            steps = {s.job for s in pipelines[0].steps}
            rows = [row for row in self.service.store.jobs() if row.name in steps]
        else:
            rows = [self.service.store.job(only)] if only else self.service.store.jobs()
        jobs = [job_status(row, self.service.store, self.service.snapshot(row.name)) for row in rows]
        sample = self.service.hosts.local.gpu.latest
        return _json(protocol.StatusResponse(
            jobs=jobs, daemon_pid=os.getpid(), daemon_version=__version__,
            gpu=gpu_devices(sample), gpu_note="" if sample and sample.available else (sample.reason if sample else "not sampled yet"),
            pipelines=pipelines, web_note=self.service.web.problem or "",
        ))

    async def jobs(self, request: web.Request) -> web.StreamResponse:
        rows = self.service.store.jobs()
        return _json(protocol.JobsResponse(jobs=[job_status(r, self.service.store, self.service.snapshot(r.name)) for r in rows]))

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
                ended = until_done and self._job_ended(query.job)
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

    def _job_ended(self, job: str) -> bool:
        runner = self.service.runners.get(job)
        return runner is None or not runner.running

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
        follower = self.service.hosts.get(row.host).host.follow(row.log_path, offset)
        ender = asyncio.create_task(self._finish_when_ended(request, row, follower, follow))
        try:
            async for batch in follower.records():
                for record in batch:
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=record.offset, text=record.text,
                                                                 redraw=record.redraw, ts=stamp and stamp(record.end)))
                tail = follower.partial_text()
                if tail:
                    await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text=tail,
                                                                 redraw=True, partial=True, ts=stamp and stamp(follower.offset)))
            await _write_line(response, protocol.LogChunk(attempt=row.n, offset=follower.offset, text="", end=True))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            ender.cancel()
            await follower.aclose()
        return response

    async def _finish_when_ended(self, request: web.Request, row: AttemptRow, follower: Follower, follow: bool) -> None:
        if follow:
            while self.service.store.attempt(row.job, row.n).state.active and not _streams.client_gone(request):
                await asyncio.sleep(0.25)
        follower.finish()

    async def gpus(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("host", "local")
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
        host = job.spec.get("host", "local")
        since = attempts[0].started if attempts else job.created
        live = any(a.ended is None for a in attempts)
        until = time.time() if live or not attempts else max(a.ended or a.started for a in attempts)
        samples = [protocol.GpuSampleInfo(ts=ts, gpu=gpu, used_mib=used, total_mib=total)
                   for ts, gpu, used, total in self.service.store.gpu_history(host, since) if ts <= until]
        return _json(protocol.JobGpuResponse(job=name, host=host, since=since, until=until, samples=samples))

    async def config(self, request: web.Request) -> web.StreamResponse:
        response = describe_settings(self.service.loaded)
        response.changed_since_start = config_changed(self.service.loaded)
        return _json(response)

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=await self.service.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def web_page(self, request: web.Request) -> web.StreamResponse:
        return _json(await self.service.web.configure(await _body(request, protocol.WebRequest)))

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(openapi_schema())

    async def restart_job(self, request: web.Request) -> web.StreamResponse:
        """Stop the job if it runs, then start it with its stored spec (overrides included)."""
        name = request.match_info["name"]
        body = await _body(request, protocol.RestartRequest)
        spec = stored_spec(self.service.store.job(name).spec, name)
        if body.fields.given():  # `restart --shards 4`: the stored spec changed, checked before the job is stopped
            spec = spec.with_overrides({}, body.fields)
            check_hosts(spec, self.service.hosts)
        load_packs(spec.probes, spec.probe_files)  # a pack gone since: refused before the job is stopped
        await asyncio.to_thread(check_local_command, spec)  # so is a command gone since
        stopped = await self._stop(name, body.grace_s)
        return _json(protocol.RestartResponse(stopped=stopped, started=await self._launch(spec)))

    async def remove_job(self, request: web.Request) -> web.StreamResponse:
        """Forget a job that is not running; its attempt logs stay unless ?logs=1."""
        name = request.match_info["name"]
        self.service.store.job(name)
        attempts = self.service.store.attempts(name)
        runner = self.service.runners.get(name)
        if (runner is not None and runner.running) or any(a.state.active for a in attempts):
            # Say what it is doing: a job waiting for GPUs or for its `after` runs nothing yet.
            state = self.service.store.job(name).state
            doing = "is running" if state is JobState.RUNNING else f"is {state.value} (not ended)"
            raise AlreadyRunning(f"job '{name}' {doing}; `supervise stop {name}` first, then `supervise rm {name}`")
        await when_free(lambda: self.service.store.delete_job(name), within_s=_VERB_STORE_WAIT_S)
        self.service.runners.pop(name, None)
        if request.query.get("logs") == "1":
            removed = remove_logs(attempts)
            arrivals.forget_job(self.service.paths.arrivals, name)
            message = f"forgot {name} ({len(attempts)} attempts) and deleted {len(removed)} log files"
        else:
            removed = []
            kept = f"; its logs stay in {Path(attempts[0].log_path).parent}" if attempts else ""
            message = f"forgot {name} ({len(attempts)} attempts){kept}"
        return _json(protocol.RemoveResponse(job=name, message=message, removed_logs=removed))

    async def prune(self, request: web.Request) -> web.StreamResponse:
        """Apply the log retention settings now, to one job (?job=) or all."""
        only = request.query.get("job")
        names = [self.service.store.job(only).name] if only else [row.name for row in self.service.store.jobs()]
        settings = self.service.loaded.settings
        rule = Retention(settings.log_keep_attempts, settings.log_max_bytes)
        removed = [p for name in names for p in prune_logs(self.service.store.attempts(name), rule)]
        arrivals.forget(self.service.paths.arrivals, [(p.job, p.attempt) for p in removed])
        prune_events(self.service.store, removed)
        freed = sum(p.size for p in removed)
        message = (f"removed {len(removed)} attempt logs ({freed} bytes); keeping the last {rule.keep_attempts} per job"
                   + (f" within {rule.max_bytes} bytes" if rule.max_bytes else ""))
        return _json(protocol.PruneResponse(message=message, removed=[
            protocol.PrunedLog(job=p.job, attempt=p.attempt, log_path=p.path, bytes=p.size) for p in removed]))

    async def stop_daemon(self, request: web.Request) -> web.StreamResponse:
        """Exit once this answer is sent; the jobs keep running and the next daemon re-adopts them."""
        asyncio.get_running_loop().call_later(0.05, self.service.request_stop)
        running = sum(1 for r in self.service.runners.values() if r.running)
        return _json(protocol.DaemonStopResponse(
            pid=os.getpid(), message=f"daemon (pid {os.getpid()}) stopped; {running} running job(s) keep running "
                                     "and the next daemon re-adopts them"))

    async def hold_job(self, request: web.Request) -> web.StreamResponse:
        """Postpone any kill of a running job until `release` (a pending one included)."""
        return _json(self._hold(request.match_info["name"], hold=True))

    async def release_job(self, request: web.Request) -> web.StreamResponse:
        """Let kills come again; a pending kill counts down again from now."""
        return _json(self._hold(request.match_info["name"], hold=False))

    async def job_stacks(self, request: web.Request) -> web.StreamResponse:
        return _json(await job_stacks(self.service, _path_name(request)))

    def _hold(self, name: str, *, hold: bool) -> protocol.HoldResponse:
        self.service.store.job(name)  # an unknown job: 404
        runner = self.service.runners.get(name)
        if runner is None or not runner.running:
            return protocol.HoldResponse(job=name, held=False, message=f"{name} is not running: nothing to "
                                                                       f"{'hold' if hold else 'release'}")
        message = runner.hold() if hold else runner.release()
        return protocol.HoldResponse(job=name, held=hold, message=message)




def build_app(service: Service) -> web.Application:
    handlers = Api(service)
    app = web.Application(middlewares=[_errors_middleware])
    app[REQUEST_TIMEOUT] = service.settings.request_timeout_s
    _streams.track(app)
    for method, path, handler_name, _, _ in ROUTES:
        app.router.add_route(method, path, getattr(handlers, handler_name))
    app.router.add_get("/openapi.json", handlers.openapi)
    app.router.add_get("/metrics", handlers.metrics_endpoint)  # Prometheus text format
    return app
