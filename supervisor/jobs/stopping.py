"""`supervise stop`, as the jobs domain does it: a job's runner, then every attempt of it still
alive whatever its state says (strays.py), then the GPU memory it may still hold; or a pipeline:
its running step and every step still to come, so that nothing of it launches afterwards."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from supervisor.core import protocol
from supervisor.core.errors import ConnectionLost, HostError, HostRefused, NotFound, RequestRejected, SpecError
from supervisor.core.events import JobState
from supervisor.hosts.base import KillReport
from supervisor.hosts.registry import Hosts
from supervisor.jobs.gpu_holders import attempt_pids, still_held
from supervisor.jobs.gpu_holders import describe as describe_held
from supervisor.jobs.pending import when_free
from supervisor.jobs.pipelines import Pipelines
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner_protocol import Runner
from supervisor.jobs.strays import StrayStop, merge_reports, stop_strays, stray_handle

# A verb's write waits this long for a lock another process holds, then answers "store busy" (74).
VERB_STORE_WAIT_S = 2.0

# A pipeline step in one of these is stopped with its pipeline: it runs, or waits to.
_UNENDED = frozenset({JobState.STARTING, JobState.WAITING, JobState.RUNNING, JobState.UNREACHABLE, JobState.BACKOFF})


class Stopping:
    """Stops for the jobs domain: it reads the runners (``runners``), never adds or drops one."""

    def __init__(self, recorder: Recorder, hosts: Hosts, runners: Mapping[str, Runner],
                 pipelines: Pipelines) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.hosts = hosts
        self.runners = runners
        self.pipelines = pipelines

    async def stop(self, name: str, grace_s: float | None) -> protocol.StopResponse:
        if (pipeline := self._pipeline_only(name)) is not None:
            return await self._stop_pipeline(pipeline, grace_s)
        stopped = await self.stop_job(name, grace_s)
        return stopped or protocol.StopResponse(job=name, message=f"{name} is not running")

    def _pipeline_only(self, name: str) -> protocol.PipelineStatus | None:
        """The pipeline of that name when no job has it (`status NAME` reads the same way)."""
        try:
            self.store.job(name)
            return None
        except NotFound:
            found = self.pipelines.statuses(name)
            if not found:
                raise
            return found[0]

    async def _stop_pipeline(self, pipeline: protocol.PipelineStatus, grace_s: float | None) -> protocol.StopResponse:
        said, processes = [], []
        store = self.store
        for step in pipeline.steps:
            if step.state not in _UNENDED:
                continue
            stopped = await self.stop_job(step.job, grace_s)
            if stopped is not None:
                said.append(f"{step.step}: {stopped.message.removeprefix(f'stopped {step.job}: ')}")
                processes += stopped.processes
                continue
            # A step still waiting for the one before it: it must never launch now.
            if (runner := self.runners.get(step.job)) is not None:
                await runner.stop(grace_s)
            if store.job(step.job).state in _UNENDED:
                reason = f"stopped with pipeline {pipeline.name} before it launched"
                await when_free(functools.partial(self.recorder.job_state, step.job, JobState.STOPPED, reason),
                                within_s=VERB_STORE_WAIT_S)
            said.append(f"{step.step}: not launched")
        message = (f"stopped pipeline {pipeline.name}: " + "; ".join(said) if said
                   else f"pipeline {pipeline.name} is not running")
        return protocol.StopResponse(job=pipeline.name, message=message, processes=processes)

    async def stop_job(self, name: str, grace_s: float | None) -> protocol.StopResponse | None:
        """Stop the job's runner, and every attempt still alive whatever the job's state says
        (strays.py); None when nothing ran."""
        job = self.store.job(name)
        runner = self.runners.get(name)
        running = runner is not None and runner.running
        before = runner.snapshot() if runner is not None else None  # the pids the runner saw: NVML may list them after the kill
        unended = [stray_handle(row) for row in self.store.attempts(name) if row.pid and row.state.active]
        report = await runner.stop(grace_s) if runner is not None and running else KillReport()
        spec = job.spec
        if spec is None:  # its runner (if any) is stopped; where its strays run is the spec's to say
            raise SpecError(f"job '{name}': its stored spec no longer validates ({job.spec_error}); its supervision is "
                            f"stopped, a process it left may still run: `supervise start` its spec file, then stop it")
        strays = StrayStop()
        for host in dict.fromkeys([spec.host, *spec.hosts]):  # a sharded job's shards run on several
            try:
                found = await stop_strays(self.recorder, self.hosts.get(host).host, spec,
                                          None, spec.stop_grace_s if grace_s is None else grace_s)
            except (ConnectionLost, HostRefused) as exc:
                raise HostError(f"cannot reach {host} to stop {name} ({exc}); its supervision is stopped, its process "
                                f"may still run there: `supervise stop {name}` again once the host answers") from exc
            strays.attempts += found.attempts
            merge_reports(strays.report, found.report)
        if not running and not strays.attempts:
            return None
        merge_reports(report, strays.report)
        slot = self.hosts.get(spec.host)  # GPU memory still held: looked for on the job's own host
        pids = await attempt_pids(slot.host, unended, report, before.known_pids if before else ())
        held = await still_held(slot.gpu.sample, pids)
        if strays.attempts and not running:
            await when_free(lambda: self.recorder.job_state(name, JobState.STOPPED, "stopped by user (it was running unwatched)"),
                            within_s=VERB_STORE_WAIT_S)
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
