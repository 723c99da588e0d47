"""`supervise stack JOB`: the Python stacks of a running job's processes, dumped now with py-spy
(the same dump a stalled attempt gets before its kill)."""

from __future__ import annotations

import asyncio

from supervisor.core import protocol
from supervisor.daemon.api._service import Service
from supervisor.hosts import stacks


async def job_stacks(service: Service, name: str) -> protocol.StacksResponse:
    service.store.job(name)  # an unknown job: 404
    runner = service.jobs.runners.get(name)
    dump = None
    if runner is not None and runner.running:
        dump = await asyncio.wait_for(runner.stacks_now(), stacks.PER_PROCESS_S + 30)
    if dump is None:
        return protocol.StacksResponse(job=name, attempt=None, message=f"{name} is not running: no stacks to dump")
    latest = service.store.latest_attempt(name)
    processes = [protocol.ProcessStackInfo(pid=p.pid, name=p.name, stack=p.stack, error=p.error) for p in dump.processes]
    message = dump.note if not dump.python and dump.note else f"{name}: {dump.counted()}"
    return protocol.StacksResponse(job=name, attempt=latest.n if latest else None, processes=processes, message=message)
