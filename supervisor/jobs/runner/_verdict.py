"""Between an unhealthy verdict and a kill: ``health.action`` (``hung_action`` and
``diverge_action`` for those two verdicts) and a hold by hand.

- ``kill``: the kill comes at once (unless held);
- ``warn``: never a kill, a warning only (the way to trust a new rule on a long run);
- ``warn_then_kill``: a warning, and the kill ``kill_after_s`` later unless the attempt moves
  meanwhile (progress makes the watchdog healthy again, which cancels it).

A hold (``supervise hold``) postpones any kill until ``release``, from which the countdown
starts again.  Pure: the caller gives the clock and does the alerting and the killing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from supervisor.core.events import Verdict
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog import Judgement


class Step(StrEnum):
    NOTHING = "nothing"
    KILL = "kill"  # kill now
    WARN = "warn"  # a new unhealthy episode, not killed now: say so (and when the kill comes, if one does)
    RECOVERED = "recovered"  # healthy again after a warning: say so (a pending kill is cancelled)


@dataclass
class KillGate:
    action: str
    kill_after_s: float
    held: bool = False
    episode: Judgement | None = None  # the unhealthy verdict warned about, until it is healthy again
    kill_at: float | None = None  # clock time of the pending kill
    by_verdict: dict[Verdict, str] = field(default_factory=dict)  # verdicts with an action of their own

    @classmethod
    def of(cls, health: HealthSpec, held: bool = False) -> KillGate:
        own = {v: health.action_for(v) for v in (Verdict.HUNG, Verdict.DIVERGED, Verdict.IDLE)}
        # max_runtime is a limit, not a suspicion: health.action = "warn" must not let it run on.
        own[Verdict.TIMEOUT] = "kill"
        return cls(health.action, health.kill_after_s, held, by_verdict=own)

    @property
    def episode_action(self) -> str:
        """The action that applies to the episode under way (``action`` when none is)."""
        return self.action if self.episode is None else self.by_verdict.get(self.episode.verdict, self.action)

    @property
    def delay_s(self) -> float:
        """How long after a warning the kill comes: at once, never, or after ``kill_after_s``."""
        return {"kill": 0.0, "warn": math.inf}.get(self.episode_action, self.kill_after_s)

    def judge(self, judgement: Judgement, now: float) -> Step:
        if judgement.verdict is Verdict.HEALTHY:
            if self.episode is None:
                return Step.NOTHING
            self.episode = self.kill_at = None
            return Step.RECOVERED
        if self.episode is None:
            self.episode = judgement
            if math.isfinite(self.delay_s):
                self.kill_at = now + self.delay_s
            if self.delay_s == 0 and not self.held:
                return Step.KILL
            return Step.WARN
        return Step.KILL if self.due(now) else Step.NOTHING

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def deadline(self) -> float | None:
        """When the pending kill comes (None: none pending, or held)."""
        return None if self.held else self.kill_at

    def hold(self) -> None:
        self.held = True

    def release(self, now: float) -> None:
        """The countdown starts again from now."""
        self.held = False
        if self.kill_at is not None:
            self.kill_at = now + self.delay_s

    def next_action(self, job: str, now: float) -> str:
        """What the warning says comes next."""
        if self.held:
            return f"nothing while held: `supervise release {job}` lets a kill come"
        if self.kill_at is None:
            name = {Verdict.HUNG: "hung_action", Verdict.DIVERGED: "diverge_action", Verdict.IDLE: "idle_action"}.get(
                self.episode.verdict if self.episode is not None else Verdict.HEALTHY, "action")
            return f"nothing: health.{name} is \"warn\", it is never killed for this"
        return f"killing in {max(0.0, self.kill_at - now):.0f} s unless it moves"
