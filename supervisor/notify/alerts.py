"""Alerts: one message per incident through apprise (any of its services), always
written to the daemon's log too.

An alert says which job and attempt, what happened, the evidence, GPU memory per device
and what the policy does next, with a severity receivers can route on (apprise's notify
types).  Repeats of the same incident (same ``key``: a job and a kind, never an attempt, so a
crash loop is one incident) within ``min_interval_s`` are suppressed and counted, and the
alert that ends the loop (gave up, done) says how many were folded in; a burst of distinct
alerts is capped too, so a crash loop cannot flood a phone.

Delivery never sits on the control path: ``send`` decides (suppressed or not) and queues, and
one task delivers, each send bounded by ``timeout_s`` in a thread of its own (a hanging or
trickling endpoint holds that thread, never the loop, the default executor, or the daemon's
exit).  The queue is bounded: when it is full the oldest waiting alert is dropped (the newest
says most about the job now), and dropped and failed deliveries are counted for the metrics.
Notification URLs carry secrets (passwords, bot tokens, webhook keys): every URL that reaches a
log goes through ``redact_url``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.core.alert_routes import AlertKind, Severity, parse_route
from supervisor.core.redact import redact_text, redact_url

log = structlog.get_logger("supervise.alerts")

_EVERY_ALERT = "supervise-every-alert"  # the tag of unrouted URLs: every alert is sent to them
# An alert is logged at its own severity: the daemon's log filtered by level (its JSON lines'
# "level") shows failures and warnings, not every job that finished well.
_LOG_LEVEL = {Severity.FAILURE: logging.ERROR, Severity.WARNING: logging.WARNING, Severity.SUCCESS: logging.INFO,
              Severity.INFO: logging.INFO}


def shown_route(entry: str) -> str:
    """A route as it may be shown: its tags and its URL redacted."""
    try:
        tags, url = parse_route(entry)
    except ValueError:
        return redact_url(entry)
    return (",".join(sorted(tags)) + "=" if tags else "") + redact_url(url)


# Alerts that end a run of repeats: they say how many of the job's alerts were folded in.
_ENDS_A_LOOP = frozenset({AlertKind.GAVE_UP, AlertKind.DONE, AlertKind.RECOVERED})
_QUEUE_LIMIT = 100


@dataclass(frozen=True)
class Alert:
    job: str
    attempt: int
    title: str
    what: str
    evidence: str
    gpu: str
    next_action: str
    key: str  # alerts with the same key are the same incident, for de-duplication
    kind: AlertKind = AlertKind.VERDICT

    @property
    def severity(self) -> Severity:
        return self.kind.severity


def format_body(alert: Alert, suppressed: int = 0, folded: dict[str, int] | None = None) -> str:
    """``folded``: the job's alerts suppressed since their last one, by what they said, told by the
    alert that ends the loop."""
    lines = [
        f"job: {alert.job}, attempt {alert.attempt}",
        f"severity: {alert.severity}",
        f"what: {alert.what}",
        "evidence:",
        *(f"  {line}" for line in (alert.evidence or "(none)").splitlines()),
        f"GPU: {alert.gpu or 'unknown'}",
        f"next: {alert.next_action}",
    ]
    if suppressed:
        lines.append(f"({suppressed} similar alert(s) suppressed since the last one)")
    if folded:
        said = ", ".join(f"{n} x {what}" for what, n in folded.items())
        lines.append(f"(the loop is over: {sum(folded.values())} more alert(s) folded in since the last sent: {said})")
    return "\n".join(lines)


@dataclass(frozen=True)
class AlertCounts:
    """What became of the alerts the daemon decided to send, for the metrics."""

    queued: int
    suppressed: int
    dropped: int  # the queue was full: the oldest waiting alert went unsent
    failed: int  # delivery refused, failed or past timeout_s


class Alerter:
    def __init__(
        self,
        urls: list[str],
        *,
        min_interval_s: float = 60.0,
        max_burst: int = 10,
        timeout_s: float = 10.0,
        queue_limit: int = _QUEUE_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._min_interval_s = min_interval_s
        self._max_burst = max_burst
        self._timeout_s = timeout_s
        self._clock = clock
        self._last_sent: dict[str, float] = {}
        self._recent: deque[float] = deque()
        self._pending_suppressed: dict[str, int] = {}
        # By job, what its suppressed alerts said (the alert that ends the loop tells them).
        self._folded: dict[str, dict[str, int]] = {}
        self.suppressed_total = 0
        self.dropped_total = 0
        self.failed_total = 0
        self.delivered_total = 0
        self._urls = [shown_route(u) for u in urls]
        self._apprise = _build_apprise(urls) if urls else None
        self._queue: deque[tuple[Alert, str]] = deque()
        self._queue_limit = queue_limit
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def urls(self) -> list[str]:
        """The configured URLs, redacted (safe to show)."""
        return list(self._urls)

    def counts(self) -> AlertCounts:
        return AlertCounts(len(self._queue), self.suppressed_total, self.dropped_total, self.failed_total)

    async def send(self, alert: Alert) -> bool:
        """Decide and queue one alert: False if suppressed or not configured, True when it is on its
        way (delivered by the alerter's own task; a failed delivery is logged and counted).  Never
        raises, never waits on an endpoint."""
        try:
            return self._accept(alert)
        except Exception as exc:  # noqa: BLE001 - an alert must never take the daemon down
            log.warning("alert failed", job=alert.job, attempt=alert.attempt, error=redact_text(str(exc)))
            return False

    def _accept(self, alert: Alert) -> bool:
        now = self._clock()
        why_not = self._suppression(alert.key, now)
        if why_not:
            self._pending_suppressed[alert.key] = self._pending_suppressed.get(alert.key, 0) + 1
            counts = self._folded.setdefault(alert.job, {})
            counts[alert.what] = counts.get(alert.what, 0) + 1
            self.suppressed_total += 1
            log.info("alert suppressed", job=alert.job, attempt=alert.attempt, key=alert.key, why=why_not,
                     suppressed=self._pending_suppressed[alert.key])
            return False
        suppressed = self._pending_suppressed.pop(alert.key, 0)
        if suppressed:
            self._forget_folded(alert.job, alert.what, suppressed)
        folded: dict[str, int] | None = None
        if alert.kind in _ENDS_A_LOOP:
            folded = self._folded.pop(alert.job, None)
        body = format_body(alert, suppressed, folded)
        log.log(_LOG_LEVEL[alert.severity], "alert", job=alert.job, attempt=alert.attempt, title=alert.title,
                what=alert.what, severity=alert.severity.value, gpu=alert.gpu, next=alert.next_action, key=alert.key)
        # Counted as sent even if delivery fails (or no URL is set): repeating it on every
        # event would only add noise; the daemon log has the alert either way.
        self._last_sent[alert.key] = now
        self._recent.append(now)
        if self._apprise is None:
            return False
        if len(self._queue) >= self._queue_limit:
            gone, _ = self._queue.popleft()
            self.dropped_total += 1
            log.warning("alert dropped: the delivery queue is full", job=gone.job, title=gone.title)
        self._queue.append((alert, body))
        self._idle.clear()
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._deliver_all(), name="alerts")
        return True

    def _forget_folded(self, job: str, what: str, n: int) -> None:
        # Told by the alert of the same key that goes out now: not again by the loop's end.
        folded = self._folded.get(job)
        if folded and what in folded:
            folded[what] -= min(n, folded[what])
            if not folded[what]:
                del folded[what]

    def _suppression(self, key: str, now: float) -> str:
        last = self._last_sent.get(key)
        if last is not None and now - last < self._min_interval_s:
            return f"same alert within {self._min_interval_s:g}s"
        while self._recent and now - self._recent[0] >= self._min_interval_s:
            self._recent.popleft()
        if len(self._recent) >= self._max_burst:
            return f"more than {self._max_burst} alerts within {self._min_interval_s:g}s"
        return ""

    async def _deliver_all(self) -> None:
        while True:
            while self._queue:
                alert, body = self._queue.popleft()
                await self._deliver(alert, body)
            self._idle.set()
            self._wake.clear()
            await self._wake.wait()

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queued alerts to be delivered (or given up on); True
        when none is left.  Shutdown gives them a moment, never a hanging endpoint's time."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout_s: float = 2.0) -> None:
        """Deliver what is queued within ``timeout_s``, then stop; what is left is logged as dropped."""
        await self.drain(timeout_s)
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        if self._queue:
            self.dropped_total += len(self._queue)
            log.warning("alerts not delivered at shutdown", count=len(self._queue))
            self._queue.clear()

    async def _deliver(self, alert: Alert, body: str) -> bool:
        assert self._apprise is not None
        apobj = self._apprise
        try:
            # Any of these tags (apprise ORs a list): every unrouted URL, and the routes naming its
            # severity or its kind.
            tags = [_EVERY_ALERT, alert.severity.value, alert.kind.value]
            ok = bool(await asyncio.wait_for(
                _in_own_thread(apobj.notify, body=body, title=alert.title,
                               notify_type=alert.severity.value, tag=tags), self._timeout_s))
        except TimeoutError:
            ok = False
            log.warning("alert delivery timed out", job=alert.job, attempt=alert.attempt,
                        timeout_s=self._timeout_s, urls=self._urls)
        except Exception as exc:  # noqa: BLE001 - a plugin's own error: counted, never raised
            ok = False
            log.warning("alert delivery raised", job=alert.job, error=redact_text(str(exc)))
        if ok:
            self.delivered_total += 1
        else:
            self.failed_total += 1
            log.warning("alert delivery failed", job=alert.job, attempt=alert.attempt, urls=self._urls)
        return ok


def _in_own_thread(fn: Callable[..., Any], **kwargs: Any) -> asyncio.Future[Any]:
    """``fn(**kwargs)`` in a daemon thread of its own: a send stuck on a trickling endpoint keeps
    that thread, not a worker of the loop's default executor (which the store's reads and the spec
    parser share), and does not hold the daemon's exit (executor threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(**kwargs), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=run, name="alert-delivery", daemon=True).start()
    return future


def _build_apprise(urls: list[str]) -> Any:
    import apprise

    _guard_apprise_logs()
    apobj = apprise.Apprise()
    with warnings.catch_warnings():
        # Loading apprise's plugins imports the stdlib's deprecated imghdr (email plugin)
        # on Python 3.11/3.12; that is apprise's business, not a problem of ours.
        warnings.simplefilter("ignore", DeprecationWarning)
        for entry in urls:
            tags, url = parse_route(entry)
            if not apobj.add(url, tag=sorted(tags) or [_EVERY_ALERT]):
                log.warning("alert URL not understood by apprise", url=redact_url(url))
    return apobj if len(apobj) else None  # no URL understood: nothing to deliver to


class _RedactFilter(logging.Filter):
    """Masks URLs in apprise's own log lines (it logs a URL it cannot parse in full)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def _guard_apprise_logs() -> None:
    logger = logging.getLogger("apprise")
    if not any(isinstance(f, _RedactFilter) for f in logger.filters):
        logger.addFilter(_RedactFilter())
