"""What an attempt says on its NOTIFY_SOCKET, folded: ``WATCHDOG=1`` into its watchdog (alive,
whether or not it prints; the first one stored, so that a new daemon knows it pings), ``STATUS=…`` into its status line (shown by `status` and the page at
once) and ``READY=1`` into one event.

The socket may be written thousands of times a second: pings are never stored (the watchdog
keeps the latest), and a changed status line is stored at most once per ``STATUS_EVERY_S`` (the
latest one when that time comes), so a noisy sender neither grows the store nor its write queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import structlog

from supervisor.core.events import Event, EventKind
from supervisor.core.payload_codec import Key, StoredPayload, carried_by
from supervisor.hosts.local.notify import NotifyMessage, NotifySocket, notify_address
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.jobs.runner._journal import Journal
from supervisor.spec.model import JobSpec

log = structlog.get_logger("supervise.runner")

STATUS_EVERY_S = 10.0
PROBE = "sd_notify"  # the stored events' probe: they come from the socket, not the log


@carried_by()  # among an info event's fields (the kind's payload is ProbeFields): read by this module alone
@dataclass(frozen=True, slots=True)
class NotifyData(StoredPayload):
    """An sd_notify event's payload: which assignment, and the status line for ``STATUS``."""

    said: Annotated[str, Key("sd_notify")]  # "READY", "STATUS", or "WATCHDOG" (the first ping only)
    status: str | None = None


def bind(ctx: RunnerContext, tag: str) -> NotifySocket | None:
    """Attempt ``tag``'s socket, bound (None on a remote host).  Bound before the launch, so that
    nothing the program sends is lost; bound again at the same address when a new daemon adopts
    the attempt, whose environment names it."""
    if ctx.notify_dir is None:
        return None
    address = notify_address(ctx.notify_dir, tag)
    try:
        return NotifySocket(address)
    except OSError as exc:  # the attempt runs without one (its pings unheard), not not at all
        log.warning("notify socket not bound", address=address, error=str(exc))
        return None


def environment(sock: NotifySocket | None, spec: JobSpec) -> dict[str, str]:
    """What the attempt's environment gains: as systemd sets it for a service with ``WatchdogSec``
    (``WATCHDOG_PID`` unset: any process of the attempt, a torchrun worker too, may ping)."""
    if sock is None:
        return {}
    env = {"NOTIFY_SOCKET": sock.address}
    if spec.health.watchdog_s is not None:
        env["WATCHDOG_USEC"] = str(int(spec.health.watchdog_s * 1_000_000))
    return env


def pings(events: list[Event]) -> bool:
    """Whether an attempt's stored events say it was heard pinging (its first ping's event)."""
    return any(e.probe == PROBE and NotifyData.of(e).said == "WATCHDOG" for e in events)


class Heartbeat:
    """One attempt's sd_notify messages, as they come (called on the loop by the socket)."""

    def __init__(self, live: Live, journal: Journal, clock: Callable[[], float]) -> None:
        self._live = live
        self._journal = journal
        self._clock = clock
        self._ready = False
        self._pinged = False
        self._stored_status: str | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._stored_at: float | None = None

    def message(self, message: NotifyMessage) -> None:
        live = self._live
        if message.watchdog:
            live.watchdog.pinged(self._clock())
            if not self._pinged:  # once: a new daemon reads it to know the attempt pings (``pings``)
                self._pinged = True
                self._record("heartbeat: WATCHDOG=1 received (pings are not stored)", NotifyData("WATCHDOG"))
        if message.ready and not self._ready:
            self._ready = True
            self._record("ready (sd_notify READY=1)", NotifyData("READY"))
        if message.status is not None and message.status != live.status_line:
            live.notified.status_line = message.status
            self._status_changed()

    def _status_changed(self) -> None:
        if self._flush is not None:
            return  # stored when the window ends, as it then stands
        now = self._clock()
        wait = 0.0 if self._stored_at is None else self._stored_at + STATUS_EVERY_S - now
        if wait <= 0:
            self._store_status()
        else:
            self._flush = asyncio.get_running_loop().call_later(wait, self._store_status)

    def _store_status(self) -> None:
        self._flush = None
        status = self._live.status_line
        if status is None or status == self._stored_status:
            return
        self._stored_status, self._stored_at = status, self._clock()
        self._record(f"status: {status}", NotifyData("STATUS", status))

    def _record(self, message: str, data: NotifyData) -> None:
        live, journal = self._live, self._journal
        event = Event(job=journal.job, attempt=live.row.n, kind=EventKind.INFO, message=message, probe=PROBE,
                      data=data.to_json())
        recorder = journal.recorder
        journal.writes.submit(lambda: recorder.events([event]))

    def close(self) -> None:
        """The attempt's watch is over: a status line still waiting for its window is stored now."""
        if self._flush is not None:
            self._flush.cancel()
            self._store_status()
