"""What a runner's attempts belong to, and where its state goes: the answers that differ between
a job's runner and a shard's (a ``Scope``).  The runner's loop is the same for both; a job's
runner is given ``JobScope`` (its attempts are the job's, its state the job's), a shard's runner
its coordinator's ``ShardScope`` (sharding.py): attempts carry the shard's index, the run is the
coordinator's, launches are numbered one at a time across shards, and the state goes to the
coordinator, which says the job's."""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from supervisor.core.errors import SuperviseError
from supervisor.core.events import JobState
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.policy import Policy
from supervisor.jobs.recorder import Recorder
from supervisor.store.database import AttemptRow


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
