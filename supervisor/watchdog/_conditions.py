"""What a rule is: a deadline from which it is violated unless an event changes the facts, the
verdict it gives and how it explains itself; and the judgement it becomes.  Below the facts
and every rule module, so that each can build conditions without importing the others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from supervisor.core.events import Verdict
from supervisor.watchdog._evidence import Evidence, NoEvidence
from supervisor.watchdog._pace import BoundSource
from supervisor.watchdog._progress import Track


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str
    evidence: Evidence = field(default_factory=NoEvidence)  # a typed value per rule; a dict only where stored or sent (to_json)


@dataclass(frozen=True)
class Condition:
    """A rule that is violated from ``deadline`` on unless an event changes the state."""

    deadline: float
    verdict: Verdict
    describe: Callable[[float], tuple[str, Evidence]]
    since: float | None = None  # when its clock started: deadline - since is the rule's bound
    source: BoundSource | None = None  # where a stall bound came from (stall rules only)
    # Reported, never a verdict: a step slower than its history (``Watchdog.slow``).
    advisory: bool = False
    bar: Track | None = None  # the bar a stall or slow-step rule watches

    @property
    def bound_s(self) -> float | None:
        # deadline - since loses the bound's last bits when since is a large clock reading: a 600 s
        # floor came back as 599.9999999999999 (shown as 9m59s).  Bounds are never finer than a microsecond.
        return None if self.since is None else round(self.deadline - self.since, 6)


def format_duration(seconds: float) -> str:
    """45.0s, 3m10s, 2h05m: short enough for an alert title."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def fine_duration(seconds: float) -> str:
    """Like ``format_duration``, with hundredths under 10 s: a shard interval of a fast replay."""
    return f"{seconds:.2f}s" if seconds < 10 else format_duration(seconds)
