"""How a runner records what happens: job state, attempt writes, its end and events, each through the
job's pending-writes queue (a full disk delays them, never drops or reorders them) to the jobs'
one ``Recorder``, which stores each, then publishes it.  Composed into the runner and handed to
each collaborator that records (the watch, the alerts, the GPU gate, the wait for `after`).

What it records belongs to a ``Scope`` (the job's, or a shard's coordinator's), and what `start`
awaits of it is told to its ``StartNews``: both below."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from supervisor.core.errors import SuperviseError
from supervisor.core.events import Event, EventKind, JobState
from supervisor.core.payloads import ActionData, Payload
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.policy import Policy
from supervisor.jobs.recorder import Recorder
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate
from supervisor.store.database import AttemptRow


class Journal:
    def __init__(self, job: str, recorder: Recorder, writes: PendingWrites, scope: Scope, news: StartNews) -> None:
        self.job = job
        self.recorder = recorder
        self.writes = writes  # the job's queue, in order; the watch also writes through it at once (``now``)
        self._scope = scope  # where the state goes: the job's, or a shard's coordinator
        self._news = news  # what `start` awaits: a `waiting` state is news for it

    def set_job(self, state: JobState, reason: str) -> None:
        self._scope.set_state(self.writes, state, reason)
        self._news.said(state)

    def update(self, n: int, update: AttemptUpdate) -> None:
        store, job = self.recorder.store, self.job
        self.writes.submit(lambda: store.update_attempt(job, n, update))

    def launched(self, n: int, process: AttemptUpdate) -> None:
        """Attempt ``n`` runs: its process (``process``) stored with its state."""
        store, job = self.recorder.store, self.job
        self.writes.submit(lambda: store.attempt_running(job, n, process))

    def ended(self, n: int, end: AttemptEnd, *told: Event) -> None:
        """Attempt ``n`` ended as ``end``, stored with the events that tell it (one transaction)."""
        recorder, job = self.recorder, self.job
        self.writes.submit(lambda: recorder.attempt_ended(job, n, end, *told))

    def event(self, n: int, kind: EventKind, message: str, payload: Payload) -> Event:
        """An event of attempt ``n``, made to be stored with a write (``ended``)."""
        return Event(job=self.job, attempt=n, kind=kind, message=message, data=payload.to_json())

    def action(self, n: int, message: str, data: ActionData) -> None:
        self.record(n, EventKind.ACTION, message, data)

    def record(self, n: int, kind: EventKind, message: str, payload: Payload) -> None:
        """An event of attempt ``n`` (0: before any), stored then published, in order with the rest."""
        event = self.event(n, kind, message, payload)
        recorder = self.recorder
        self.writes.submit(lambda: recorder.events([event]))


# What a runner's start comes to, told by the runner as it happens (never read back from the
# store): its first attempt running, or a wait that `start` says at once rather than after a
# silent minute (for the jobs it runs after, for GPU memory other processes hold).  Its end is
# the runner's task ending.  A sharded job's shards share their coordinator's news: the first
# shard's attempt is the start's.

class StartNews:
    def __init__(self) -> None:
        self.launched = asyncio.Event()
        self.held = asyncio.Event()
        self.attempt: AttemptRow | None = None  # the first attempt of this start, once it runs

    def running(self, row: AttemptRow) -> None:
        if self.attempt is None:
            self.attempt = row
            self.launched.set()

    def said(self, state: JobState) -> None:
        """The runner set the job's state: `waiting` is news for `start`."""
        if state is JobState.WAITING:
            self.held.set()

    async def first(self, ended: Awaitable[object] | None, timeout_s: float) -> None:
        """Until the attempt runs, the start is held, the runner ends (``ended``), or ``timeout_s``."""
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self.launched.wait()),
                                              asyncio.ensure_future(self.held.wait())}
        ender = asyncio.ensure_future(ended) if ended is not None else None
        try:
            await asyncio.wait(waits | ({ender} if ender else set()), timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()


# What a runner's attempts belong to, and where its state goes: the answers that differ between
# a job's runner and a shard's (a ``Scope``).  The runner's loop is the same for both; a job's
# runner is given ``JobScope`` (its attempts are the job's, its state the job's), a shard's runner
# its coordinator's ``ShardScope`` (sharding.py): attempts carry the shard's index, the run is the
# coordinator's, launches are numbered one at a time across shards, and the state goes to the
# coordinator, which says the job's.

class Scope(Protocol):
    @property
    def shard(self) -> int | None:
        """Stored with each attempt (None: a job's, not a shard's)."""

    def set_state(self, writes: PendingWrites, state: JobState, reason: str) -> None:
        """The runner's state, recorded in order with its other writes."""

    def run_so_far(self, resume: AttemptRow | None) -> tuple[int, int, str | None]:
        """The run the coming attempts belong to, the attempts of it spent, the last fingerprint."""

    def rest_of_backoff(self, policy: Policy) -> float:
        """After a daemon restart in a backoff: how much of it is left (0: none)."""

    def numbering(self) -> AbstractAsyncContextManager[object]:
        """Held while an attempt is numbered and stored."""


class JobScope:
    shard: int | None = None  # stored with each attempt

    def __init__(self, recorder: Recorder, job: str) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.job = job

    def set_state(self, writes: PendingWrites, state: JobState, reason: str) -> None:
        """The runner's state: the job's, recorded in order with its other writes."""
        writes.submit(lambda: self.recorder.job_state(self.job, state, reason))

    def run_so_far(self, resume: AttemptRow | None) -> tuple[int, int, str | None]:
        """The run the coming attempts belong to, the attempts of it already spent, and the
        fingerprint of the last one (the policy's "same failure twice"): a re-adopted attempt
        continues the run it belonged to; a fresh start opens a new run with a fresh budget."""
        if resume is None:
            return self.store.next_run_number(self.job), 0, None
        return resume.run, resume.run_attempt - 1, self.previous_fingerprint(resume)

    def previous_fingerprint(self, resume: AttemptRow) -> str | None:
        with contextlib.suppress(SuperviseError):
            return self.store.attempt(self.job, resume.n - 1).fingerprint
        return None

    def rest_of_backoff(self, policy: Policy) -> float:
        """After a daemon restart in a backoff: how much of it is left before the next launch (0: none)."""
        return 0.0

    def numbering(self) -> AbstractAsyncContextManager[object]:
        """Held while an attempt is numbered and stored (it is numbered, then stored after an await)."""
        return contextlib.nullcontext()
