"""The pipeline coordinator the daemon runs: start a pipeline (its steps as jobs, each `after`
the steps before it, done steps with the same inputs skipped), bring back the waiting ones
after a daemon restart, and say where each pipeline stands.

Sequencing is the runners' (supervisor/jobs/dependencies.py): a step's job waits, `waiting`, until the
jobs it runs after are done, and is `cancelled` if one gives up.  A restart of the daemon finds
the waiting jobs in the store and gives each its runner again (`resume_waiting`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from supervisor.core import protocol
from supervisor.core.errors import AlreadyRunning, HostError, NotFound, SpecError
from supervisor.core.events import JobState, Verdict
from supervisor.hosts.registry import Hosts
from supervisor.jobs.dependencies import GIVEN_UP, check_after
from supervisor.jobs.pipeline_eta import overall_eta
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner_protocol import Runner
from supervisor.jobs.views import attempt_info
from supervisor.probes import load_packs
from supervisor.spec.command_check import check_local_command
from supervisor.spec.model import JobSpec
from supervisor.spec.pipeline import (
    ResolvedPipeline,
    ResolvedStep,
    fingerprint,
    load_pipeline,
    resolve,
)
from supervisor.store.pipelines import PipelineRow, PipelineStore, StepRow

_WAITING = (JobState.STARTING, JobState.WAITING)


class Pipelines:
    def __init__(self, recorder: Recorder, hosts: Hosts, runners: Mapping[str, Runner],
                 start_runner: Callable[[JobSpec], Runner]) -> None:
        self.recorder = recorder
        self.store = store = recorder.store
        self.rows = PipelineStore(store)
        self.hosts = hosts
        self.runners = runners
        self.start_runner = start_runner

    async def start(self, body: protocol.PipelineStartRequest) -> protocol.PipelineStartResponse:
        # In a thread: the files and packs may sit on a slow file system, and the loop serves every job.
        pipeline = await asyncio.to_thread(_load_checked, body)
        for step in pipeline.steps:
            try:
                self.hosts.check(step.spec.host)
            except (HostError, SpecError) as exc:  # SpecError: a scheme no host kind has
                raise SpecError(f"{pipeline.spec_path}: step {step.step}: field 'host': {exc}") from exc
        busy = [s.job for s in pipeline.steps if (r := self.runners.get(s.job)) is not None and r.running]
        if busy:
            raise AlreadyRunning(f"pipeline {pipeline.name}: {', '.join(busy)} still running or waiting; "
                                 f"`supervise stop {busy[0]}` first")
        skipped = self._skippable(pipeline)
        to_run = [s for s in pipeline.steps if s.step not in skipped]
        check_after(self.store, {s.job: list(s.spec.after) for s in to_run})
        self.rows.save(pipeline.name, pipeline.spec_path, body.overrides,
                       [StepRow(s.step, s.job, s.step in skipped) for s in pipeline.steps])
        # All registered before any runner starts: a step must never see the previous run's `done`.
        for step in to_run:
            self.store.upsert_job(step.job, step.spec.model_dump(mode="json"), JobState.STARTING)
            self.recorder.job_state(step.job, JobState.STARTING)
        for step in to_run:
            self.start_runner(step.spec)
        return protocol.PipelineStartResponse(pipeline=pipeline.name, started=[s.step for s in to_run],
                                              skipped=sorted(skipped, key=[s.step for s in pipeline.steps].index),
                                              message=_started_message(pipeline, to_run, skipped))

    def _skippable(self, pipeline: ResolvedPipeline) -> set[str]:
        """Steps done with the same inputs, whose earlier steps are all skipped too (a step run
        again may change what the steps after it read, whatever their own spec says)."""
        skipped: set[str] = set()
        for step in pipeline.steps:
            if all(a in skipped for a in step.after_steps) and self._done_with_same_inputs(step):
                skipped.add(step.step)
        return skipped

    def _done_with_same_inputs(self, step: ResolvedStep) -> bool:
        try:
            row = self.store.job(step.job)
            return row.state is JobState.DONE and row.spec is not None and fingerprint(row.spec) == fingerprint(step.spec)
        except (NotFound, SpecError):
            return False

    def resume_waiting(self) -> list[str]:
        """After a daemon restart: every job still waiting for its `after` gets its runner back."""
        notes = []
        for row in self.store.jobs():
            if row.state not in _WAITING or not row.after or row.name in self.runners:
                continue
            if (latest := self.store.latest_attempt(row.name)) is not None and latest.state.active:
                continue  # recovery re-adopted it
            spec = row.spec
            if spec is None:
                self.recorder.job_state(row.name, JobState.FAILED, f"spec unreadable on recovery: {row.spec_error}")
                continue
            self.start_runner(spec)
            notes.append(f"{row.name}: waiting again for {', '.join(spec.after)}")
        return notes

    def statuses(self, only: str | None = None) -> list[protocol.PipelineStatus]:
        return [self._status(row) for row in self.rows.all() if only is None or row.name == only]

    def _status(self, row: PipelineRow) -> protocol.PipelineStatus:
        steps = [self._step_status(s) for s in row.steps]
        current = next((s for s in steps if s.state in GIVEN_UP), None) or next((s for s in steps if s.state is not JobState.DONE), None)
        if current is None:
            return protocol.PipelineStatus(name=row.name, state=JobState.DONE, reason="every step done",
                                           started=row.started, steps=steps)
        eta = overall_eta(steps, self._done_durations, time.time())
        return protocol.PipelineStatus(name=row.name, state=current.state, current=current.step, started=row.started,
                                       reason=f"step {current.step}: {current.reason}" if current.reason else f"step {current.step}",
                                       steps=steps, eta_s=eta.eta_s, eta_note=eta.note)

    def _done_durations(self, job: str) -> list[float]:
        return [a.ended - a.started for a in self.store.attempts(job) if a.verdict is Verdict.DONE and a.ended is not None]

    def _step_status(self, step: StepRow) -> protocol.PipelineStepStatus:
        try:
            job = self.store.job(step.job)
        except NotFound:
            return protocol.PipelineStepStatus(step=step.step, job=step.job, state=JobState.STOPPED,
                                               reason="its job was removed (`supervise rm`)", skipped=step.skipped)
        latest = self.store.latest_attempt(step.job)
        return protocol.PipelineStepStatus(step=step.step, job=step.job, state=job.state, reason=job.reason,
                                           skipped=step.skipped, attempt=attempt_info(latest) if latest else None)


def _load_checked(body: protocol.PipelineStartRequest) -> ResolvedPipeline:
    path = Path(body.spec_path)
    pipeline = resolve(load_pipeline(path), path, body.overrides, body.fields)
    for step in pipeline.steps:
        load_packs(step.spec.probes, step.spec.probe_files)
        check_local_command(step.spec)  # the first step's (the others run after it: it may install theirs)
    return pipeline


def _started_message(pipeline: ResolvedPipeline, to_run: list[ResolvedStep], skipped: set[str]) -> str:
    parts = [f"started pipeline {pipeline.name}"]
    if to_run:
        parts.append("steps " + " -> ".join(s.step for s in to_run))
    else:
        parts.append("nothing to run")
    if skipped:
        parts.append("skipped " + ", ".join(s.step for s in pipeline.steps if s.step in skipped)
                     + " (done with the same inputs)")
    return "; ".join(parts)
