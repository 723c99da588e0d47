"""Launching one attempt: numbered and stored as `launching` before the host is asked (a daemon
that dies meanwhile leaves a row the next one's recovery sees), then `running` with its pid (or
its scheduler's job id), and its ``Live`` handles for the watch."""

from __future__ import annotations

import asyncio
import time
import uuid

from supervisor.core.actions import AttemptAction
from supervisor.core.errors import LaunchError, SuperviseError
from supervisor.core.events import AttemptState, EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, LaunchedData
from supervisor.hosts.base import LaunchRequest
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.pending import when_free
from supervisor.jobs.runner import _forensics as forensics
from supervisor.jobs.runner import _heartbeat as heartbeat
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._ending import gpu_baseline
from supervisor.jobs.runner._journal import Journal
from supervisor.jobs.runner._news import StartNews
from supervisor.jobs.runner._pacing import Paces
from supervisor.jobs.runner._start_point import StartPoint
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate
from supervisor.store.database import AttemptRow


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
        env.update(await asyncio.to_thread(forensics.prepare, spec, argv, log_path))
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
