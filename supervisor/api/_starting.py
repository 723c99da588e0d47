"""What `start` waits for after it has handed a job its runner: the attempt launched, the launch
refused, or a wait that is said at once (for the jobs it runs after, for GPU memory that other
processes hold) rather than after a silent minute."""

from __future__ import annotations

import asyncio
import time

from ..errors import RequestRejected, SuperviseError, error_of, http_status, row_of
from ..events import AttemptState, JobState
from ..runner import JobRunner
from ..sharding import ShardedJob
from ..store import Store


async def wait_for_attempt(store: Store, job: str, runner: JobRunner | ShardedJob) -> int:
    """Wait until the runner has launched (or failed to launch) the job's new attempt; 0 when
    its `after` holds it (waiting, or cancelled)."""
    before = store.latest_attempt(job)
    previous = before.n if before else 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        latest = store.latest_attempt(job)
        # No pid: the launch failed (the attempt ended at once); the runner's error says why.
        if latest is not None and latest.n > previous and latest.state is not AttemptState.LAUNCHING and latest.pid is not None:
            return latest.n
        if not runner.running:
            if store.job(job).state is JobState.CANCELLED:
                return 0
            raise _start_failure(job, runner, store.job(job).reason)
        if runner.spec.after and store.job(job).state is JobState.WAITING:
            return 0  # waits for the jobs it runs after: `status` says for which
        if gpu_wait(runner) is not None:
            return 0  # waits for GPU memory other processes hold: said at once
        await asyncio.sleep(0.02)
    raise RequestRejected(f"{job} did not launch within 60s: `supervise status {job}` says where it stands", 504)


def gpu_wait(runner: JobRunner | ShardedJob) -> str | None:
    """What the runner's launch waits for on the GPUs, if it waits."""
    return runner.gpu_wait


def _start_failure(job: str, runner: JobRunner | ShardedJob, reason: str) -> SuperviseError:
    """Why the runner ended before its first attempt ran, as the class of the error that ended it
    (a host that cannot be reached: ConnectionLost, 69).  No error: it refused to launch (GPUs
    held by other processes, or a stop while it waited for them): the request is refused (69)."""
    cause = runner.error
    if cause is None:
        return RequestRejected(f"could not start {job}: {reason}", 503)
    return error_of(row_of(cause).kind, f"could not start {job}: {cause}", http_status(cause))
