"""The one writer of events: every event the daemon keeps goes through ``Recorder``, in order —
stored first (one transaction, with what it brings its attempt or job to), then published on
the bus.  A job's state change is an event too (``state``), stored in the same transaction as
the job's row, so a reader of the bus (`events -f`, the page, a log follower awaiting an
attempt's end) learns of it from the bus and finds the store already saying it.

An attempt's end is one value (``AttemptEnd``), stored with the event that tells it in one
transaction by ``attempt_ended``; it and the job's state are written nowhere else (a test holds
every module to that).

Published events always carry their id: a reader that subscribed before reading the store's
backlog can tell what it has seen.  An event the store already held (the same probe line read
again after a restart) is not published twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from supervisor.core.bus import EventBus
from supervisor.core.events import Event, EventKind, JobState
from supervisor.core.payloads import StateData
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate
from supervisor.store.database import Store


class Recorder:
    def __init__(self, store: Store, bus: EventBus) -> None:
        self.store = store
        self.bus = bus

    def events(self, events: Sequence[Event], *, unpublished: Sequence[Event] = (),
               update: AttemptUpdate | None = None, replaced: Iterable[int] = ()) -> list[Event]:
        """Store ``events`` and ``unpublished`` (a bar's latest line, which stands for its end
        until the next write replaces it: not sent to each follower) with what they bring their
        attempt to (``update``: its new log offset, phase, progress), then publish ``events``.

        Stored in log order, both together: a bar's latest line may come before another bar's
        milestones in the log (an outer bar over files, an inner bar per file), and `events`
        lists rows in the order stored."""
        published = {id(event) for event in events}
        stored = self.store.record_events(_in_log_order([*events, *unpublished]), update=update, replaced=replaced)
        self.bus.publish([e for e in stored if id(e) in published and e.id is not None])
        return stored

    def attempt_ended(self, job: str, n: int, end: AttemptEnd, *told: Event) -> None:
        """Attempt ``n`` of ``job`` ended as ``end``: stored with the events that tell it (its
        action, its exit) in one transaction, then published.  An attempt ends once: a second end
        is refused (TransitionRefused) and nothing of it is stored."""
        stored = self.store.end_attempt(end, told, job=job, n=n)
        self.bus.publish([e for e in stored if e.id is not None])

    def job_state(self, job: str, state: JobState, reason: str = "") -> None:
        """The job's new state, stored with its ``state`` event (numbered with the job's latest
        attempt: 0 before any), then published."""
        latest = self.store.next_attempt_number(job) - 1
        event = Event(job=job, attempt=latest, kind=EventKind.STATE, message=f"{state.value}: {reason}" if reason else state.value,
                      data=StateData(state, reason).to_json())
        self.store.record_events([event], job_state=(state, reason))
        self.bus.publish([event] if event.id is not None else [])


def _in_log_order(events: list[Event]) -> list[Event]:
    """Events read from a log, by where they were read (a stable sort: lines of one record keep
    their order); a batch holding any event without a place in the log is left as it came."""
    if any(event.offset is None for event in events):
        return events
    return sorted(events, key=lambda event: (event.generation, event.offset or 0))
