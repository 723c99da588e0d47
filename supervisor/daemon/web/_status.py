"""What the page shows, as typed values: the `status` message of the event stream and the log tail."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from supervisor.core import protocol
from supervisor.jobs.views import attempt_info, gpu_devices, job_statuses

if TYPE_CHECKING:
    from supervisor.daemon.api import Service as WebService
    from supervisor.hosts.base import Host

_TAIL_BYTES = 256 * 1024  # how far back from a log's end the tail starts


class PageStatus(BaseModel):
    """Sent on connect, after each batch of events and every few seconds (ages, countdowns)."""

    now: float = Field(description="the daemon's clock: the page counts down from it")
    read_only: bool
    jobs: list[protocol.JobStatus]
    gpus: list[protocol.GpuDeviceInfo]
    gpu_note: str
    pid_jobs: dict[int, str] = Field(description="GPU process pid -> the job whose tree it belongs to")
    attempts: list[protocol.AttemptInfo] = Field(default_factory=list, description="the job page's job only")


class LogTail(BaseModel):
    attempt: int
    lines: list[str] = Field(description="the last lines, each progress bar's redraws collapsed onto one")
    partial: str = Field(description="the unterminated tail (a progress bar's latest redraw)")


def page_status(service: WebService, read_only: bool, job: str | None) -> PageStatus:
    store = service.store
    rows = [store.job(job)] if job else store.jobs()
    # Each runner's snapshot taken once: the jobs' rows and the pids the page maps to them.
    snapshots = {name: service.snapshot(name) for name in {*(row.name for row in rows), *service.jobs.runners}}
    sample = service.hosts.local.gpu.latest
    pid_jobs = {pid: name for name in service.jobs.runners if (snap := snapshots[name]) is not None
                for pid in snap.known_pids}
    return PageStatus(
        now=time.time(), read_only=read_only,
        jobs=job_statuses(rows, store, snapshots.__getitem__),
        gpus=gpu_devices(sample),
        gpu_note="" if sample and sample.available else (sample.reason if sample else "not sampled yet"),
        pid_jobs=pid_jobs,
        attempts=[attempt_info(a) for a in store.attempts(job)] if job else [],
    )


async def log_tail(host: Host, local: bool, attempt: int, path: str, lines: int, known_end: int = 0) -> LogTail:
    """The log's last ``lines`` records, read to its current end from ``_TAIL_BYTES`` before it:
    a local log's size says where that is; a remote log's ``known_end`` (how far the daemon has
    read it, stored with its events) stands in for it, so a page never reads 150 MB over SSH."""
    offset = max(0, known_end - _TAIL_BYTES)
    if local:
        try:
            offset = max(0, os.stat(path).st_size - _TAIL_BYTES)
        except FileNotFoundError:
            return LogTail(attempt=attempt, lines=[], partial="")
    follower = host.follow(path, offset)
    follower.finish()  # read to the current end, then stop
    kept: list[str] = []
    last_was_redraw = False
    first = offset > 0  # the first record may start mid-line
    try:
        async for batch in follower.records():
            for record in batch:
                if first:
                    first = False
                    continue
                if last_was_redraw and kept:
                    kept[-1] = record.text  # a redraw replaces the bar it redrew
                else:
                    kept.append(record.text)
                last_was_redraw = record.redraw
                del kept[:-lines]
        partial = follower.partial_text()
    finally:
        await follower.aclose()
    return LogTail(attempt=attempt, lines=kept, partial=partial)
