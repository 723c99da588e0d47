"""How a runner records what happens: job state, attempt writes, its end and events, each through the
job's pending-writes queue (a full disk delays them, never drops or reorders them) to the jobs'
one ``Recorder``, which stores each, then publishes it.  Composed into the runner and handed to
each collaborator that records (the watch, the alerts, the GPU gate, the wait for `after`)."""

from __future__ import annotations

from supervisor.core.events import Event, EventKind, JobState
from supervisor.core.payloads import ActionData, Payload
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner._news import StartNews
from supervisor.jobs.runner._scope import Scope
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate


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
