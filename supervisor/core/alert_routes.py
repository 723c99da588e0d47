"""What an alert is (its kind and severity) and how a notification URL is routed to some of them:
the settings file checks a route the way the alerter reads it, so both live in the vocabulary."""

from __future__ import annotations

import re
from enum import StrEnum


class AlertKind(StrEnum):
    """What an alert is about (``notices`` composes each kind)."""

    VERDICT = "verdict"  # an attempt ended unhealthy (or was judged so) and the job goes on
    GAVE_UP = "gave_up"  # the job will not be relaunched
    DONE = "done"
    PHASE = "phase"  # a phase the spec names was reached (alerts.notify_phases)
    ETA = "eta"  # how far a bar has come and how long it has left (alerts.eta_every_s / eta_at_percent)
    WARNING = "warning"  # unhealthy while running, not killed (yet): health.action warn / warn_then_kill, or held
    RECOVERED = "recovered"  # it moved again after a warning: a pending kill is cancelled
    SLOW = "slow"  # a step well over what earlier attempts took: reported, never killed for
    UNREACHABLE = "unreachable"  # the attempt's host does not answer: it is not watched until it does
    GPU_FAULT = "gpu_fault"  # a GPU the attempt uses reported an Xid, an ECC error, a slowdown

    @property
    def severity(self) -> Severity:
        return _SEVERITY[self]


class Severity(StrEnum):
    """How bad an alert is: apprise's notify types, which receivers route on (a pager for failures)."""

    FAILURE = "failure"
    WARNING = "warning"
    SUCCESS = "success"
    INFO = "info"


_SEVERITY = {
    AlertKind.VERDICT: Severity.FAILURE, AlertKind.GAVE_UP: Severity.FAILURE,
    AlertKind.WARNING: Severity.WARNING, AlertKind.SLOW: Severity.WARNING, AlertKind.UNREACHABLE: Severity.WARNING,
    AlertKind.GPU_FAULT: Severity.FAILURE,
    AlertKind.DONE: Severity.SUCCESS, AlertKind.RECOVERED: Severity.SUCCESS,
    AlertKind.PHASE: Severity.INFO, AlertKind.ETA: Severity.INFO,
}
# A URL may be routed: "failure,gpu_fault=ntfy://ntfy.sh/pager" gets only the alerts of those
# severities or kinds (apprise's own "tag=url" form); an unrouted URL gets every alert.
_ROUTE = re.compile(r"^\s*([a-z_]+(?:\s*,\s*[a-z_]+)*)\s*=(.+)$", re.S)


def route_tags() -> list[str]:
    """What a route may name: a severity or an alert kind."""
    return [s.value for s in Severity] + [k.value for k in AlertKind]


def parse_route(entry: str) -> tuple[frozenset[str], str]:
    """("failure,gpu_fault=ntfy://…") -> ({failure, gpu_fault}, "ntfy://…"); an unrouted URL has no
    tags.  A name that is neither a severity nor a kind is a ValueError saying which are."""
    match = _ROUTE.match(entry)
    if match is None or "://" not in match.group(2):
        return frozenset(), entry.strip()
    tags = frozenset(t.strip() for t in match.group(1).split(","))
    unknown = sorted(tags - set(route_tags()))
    if unknown:
        raise ValueError(f"alert route {unknown[0]!r} is neither a severity ({', '.join(s.value for s in Severity)}) "
                         f"nor an alert kind ({', '.join(k.value for k in AlertKind)})")
    return tags, match.group(2).strip()
