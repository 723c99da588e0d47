"""The judge: feeds events to the facts, asks the rules, and remembers its final word."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.events import Event, Failure, Phase, Record, Verdict
from supervisor.core.resource_limits import LimitHit
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog._conditions import Condition, Judgement
from supervisor.watchdog._evidence import Also
from supervisor.watchdog._exit import judge_exit
from supervisor.watchdog._facts import Facts
from supervisor.watchdog._pace import BoundSource, PaceHistory
from supervisor.watchdog._progress import ProgressState
from supervisor.watchdog._redraws import Redraws
from supervisor.watchdog._rules import conditions, healthy
from supervisor.watchdog._runtime import past_max_runtime
from supervisor.watchdog._straggler import Straggler


@dataclass(frozen=True)
class WatchdogState:
    """One look at an attempt as the watchdog sees it: what the runner stores after a batch of
    events, and when the verdict could next change with no new event."""

    phase: Phase | None
    phase_entered_at: float  # clock time (the attempt's start before any phase)
    progress: ProgressState | None
    failure: Failure | None  # the root cause of the failures logged: the attempt's failure as stored
    failures_seen: int
    last_output_at: float  # clock time (the attempt's start before any output)
    next_check_at: float | None  # clock time; None when no rule is pending


class Watchdog:
    """Judges one attempt; feed it events in arrival order."""

    def __init__(self, health: HealthSpec, *, clock: Callable[[], float] = time.monotonic,
                 history: PaceHistory | None = None, started_at: float | None = None,
                 max_runtime_s: float | None = None) -> None:
        """``history``: what earlier attempts of the same job showed of each bar's pace.
        ``started_at``: the attempt's start on ``clock`` (now when not given; a re-adopted
        attempt gives its true start, so rules measured from it are not reset by a restart).
        ``max_runtime_s``: the spec's wall-clock limit, counted from that start (None: none)."""
        self._health = health
        self._max_runtime_s = max_runtime_s
        self._clock = clock
        self._facts = Facts(started_at=clock() if started_at is None else started_at)
        if history is not None:
            self._facts.history = history
        self._facts.loss.k = health.diverge_k
        self._facts.stragglers.factor = health.straggler_factor
        self._facts.stragglers.steps = health.straggler_steps
        self._final: Judgement | None = None
        self._last_unhealthy: Judgement | None = None
        # The rules' conditions depend on the facts alone (a deadline each, not the time now), so
        # they are made once per change of the facts: the runner asks for the next check, the
        # verdict, slow steps and stall bounds after every read, each of which made them anew.
        self._made: list[Condition] | None = None

    def anew(self) -> Watchdog:
        """A watchdog for the same attempt judged from now on (one that left a batch queue), with
        the same spec, clock and history."""
        return Watchdog(self._health, clock=self._clock, history=self._facts.history, max_runtime_s=self._max_runtime_s)

    # ---- state -------------------------------------------------------------------

    def state(self, now: float | None = None) -> WatchdogState:
        facts = self._facts
        return WatchdogState(
            phase=facts.phase, phase_entered_at=facts.phase_entered_at, progress=facts.progress,
            failure=facts.primary_failure, failures_seen=facts.failure_count, last_output_at=facts.last_output_at,
            next_check_at=self.next_check_at(now),
        )

    @property
    def phase(self) -> Phase | None:
        return self._facts.phase

    @property
    def progress(self) -> ProgressState | None:
        """The progress bar that moved most recently (finished and earlier-phase bars included)."""
        return self._facts.progress

    @property
    def phase_entered_at(self) -> float:
        """Clock time the current phase began (the attempt's start before any phase)."""
        return self._facts.phase_entered_at

    @property
    def last_output_at(self) -> float:
        """Clock time of the latest output (the attempt's start before any)."""
        return self._facts.last_output_at

    @property
    def paused(self) -> tuple[float, str] | None:
        """A wait the program announces (``paused`` heartbeats): when it began (clock time) and its
        latest line; None when it is not waiting so."""
        p = self._facts.paused
        return None if p is None else (p.since, p.line)

    @property
    def failures(self) -> list[Failure]:
        """The first failures logged, in order."""
        return list(self._facts.failures)

    @property
    def failure(self) -> Failure | None:
        """The root cause of the failures logged (``probes.root_cause``): the attempt's failure."""
        return self._facts.primary_failure

    # ---- input -------------------------------------------------------------------

    def output_seen(self, now: float | None = None, *, heartbeats_only: bool = False) -> None:
        """Records arrived: the process is not silent.  ``heartbeats_only``: they were all
        "still waiting" lines, which show it alive but not doing anything."""
        self._made = None
        self._facts.output_seen(self._now(now), heartbeats_only=heartbeats_only)

    def pinged(self, now: float | None = None) -> None:
        """The program sent ``WATCHDOG=1`` (sd_notify): alive, whether or not it prints."""
        self._made = None
        self._facts.pinged(self._now(now))

    def listening(self, now: float | None = None) -> None:
        """A new daemon listens for the attempt's pings from now (re-adopted): the ``watchdog_s``
        rule counts from here, as no ping sent before could be heard.  Not output: the silence
        rules keep the log's own past."""
        self._made = None
        self._facts.pings_heard_from = self._now(now)

    def records_seen(self, records: Sequence[Record]) -> None:
        """The records themselves: their last lines are the evidence of a failure no probe knew."""
        self._facts.tail.seen(records)

    def gpus_sampled(self, devices: tuple[int, ...], busy: bool, now: float | None = None) -> None:
        """A GPU sample showed the attempt's processes on ``devices`` (none: not on a GPU), and
        whether any of them computed (utilisation above 0)."""
        self._made = None
        self._facts.gpu.sampled(devices, busy, self._now(now))

    def observe(self, event: Event, now: float | None = None) -> bool:
        """A probe event: a phase, a progress step, a failure (``event.failure``), a heartbeat.
        Returns False when it changed nothing the rules read (see ``Facts.observe``): the
        same event again at the same time need not be fed."""
        self._made = None
        return self._facts.observe(event, self._now(now))

    def redrawn(self, run: Redraws, now: float | None = None) -> bool:
        """A run of one bar's redraws read together, as one summary (``_redraws``): folded in as its
        lines one by one would be, or, when one of them could do more than move the bar's count,
        refused (False: nothing changed; feed them with ``observe``)."""
        taken = self._facts.redrawn(run, self._now(now))
        if taken:
            self._made = None
        return taken

    def unchanged_by(self, probe: str | None, phase: Phase | None, fields: Mapping[str, Any],
                     now: float | None = None) -> bool:
        """Whether a plain info line (not a failure) would change nothing if fed now: it need not be."""
        return self._facts.unchanged_by(probe, phase, fields, self._now(now))

    # ---- judgement while running ---------------------------------------------------

    def check(self, now: float | None = None) -> Judgement:
        if self._final is not None:
            return self._final
        at = self._now(now)
        violated = [c for c in self._conditions() if at >= c.deadline and not c.advisory]
        if not violated:
            self._last_unhealthy = None
            return healthy(self._facts, at)
        # The rule broken first wins, so the verdict does not flip as more rules break.
        first = min(violated, key=lambda c: (c.deadline, c.verdict != Verdict.STALLED))
        reason, evidence = first.describe(at)
        others = [c.describe(at)[0] for c in violated if c is not first]
        if others:
            evidence = Also(evidence, tuple(others))
        judgement = Judgement(first.verdict, reason, evidence)
        self._last_unhealthy = judgement
        return judgement

    def slow(self, now: float | None = None) -> list[tuple[str, Judgement]]:
        """Bars whose current step has taken well over what earlier attempts took, while no stall
        is due yet: (the bar's key and step, for de-duplication; the report)."""
        if self._final is not None:
            return []
        at = self._now(now)
        conditions = self._conditions()
        if any(at >= c.deadline for c in conditions if not c.advisory):
            return []  # a verdict is due: it says more than a slow report would
        found = []
        for c in conditions:
            if c.advisory and at >= c.deadline and c.bar is not None:
                reason, evidence = c.describe(at)
                found.append((f"{c.bar.bar}@{c.bar.done}", Judgement(c.verdict, reason, evidence)))
        return found

    def stragglers(self) -> list[Straggler]:
        """The processes found behind their peers since last asked (each once per streak of slow steps)."""
        return self._facts.stragglers.take()

    def stall_bounds(self, now: float | None = None) -> list[tuple[str, float, float, BoundSource]]:
        """Each watched bar's stall bound: (bar, bound in s, s left of it, where it came from)."""
        if self._final is not None:
            return []
        at = self._now(now)
        found = []
        for c in self._conditions():
            if c.advisory or c.source is None or c.bar is None:  # only a bar's stall rule carries a source
                continue
            found.append((c.bar.bar or c.bar.probe, c.bound_s or 0.0, max(0.0, c.deadline - at), c.source))
        return found

    def paces(self) -> dict[str, list[float]]:
        """The intervals this attempt measured of each bar, by bar key: the next attempt's history."""
        return self._facts.paces()

    def next_check_at(self, now: float | None = None) -> float | None:
        """The earliest clock time at which ``check()`` could change with no new event: now, when
        an event made a rule due at once (a NaN loss) and no ``check()`` has said so yet."""
        if self._final is None and self._last_unhealthy is None:
            at = self._now(now)
            # A rule with no bound (due the moment its event came) is never pending beforehand.
            if any(at >= c.deadline and c.bound_s == 0 and not c.advisory for c in self._conditions()):
                return at
        pending = self._pending(now)
        return min(c.deadline for c in pending) if pending else None

    def upcoming(self, now: float | None = None) -> tuple[float, Verdict, str] | None:
        """The rule that comes due first if nothing changes: its clock deadline, the verdict it
        would give and the reason it would give then.  None when no rule is pending."""
        first = self.first_due(now)
        return None if first is None else (first.deadline, first.verdict, first.describe(first.deadline)[0])

    def first_due(self, now: float | None = None) -> Condition | None:
        """The pending rule that comes due first, None when none is pending."""
        pending = [c for c in self._pending(now) if not c.advisory]
        return min(pending, key=lambda c: c.deadline) if pending else None

    def _pending(self, now: float | None) -> list[Condition]:
        if self._final is not None:
            return []
        at = self._now(now)
        return [c for c in self._conditions() if c.deadline > at]

    def _conditions(self) -> list[Condition]:
        made = self._made
        if made is None:
            made = self._made = conditions(self._health, self._facts) + past_max_runtime(self._max_runtime_s,
                                                                                          self._facts)
        return made

    # ---- judgement at exit ------------------------------------------------------------

    def exited(self, returncode: int | None, signal: int | None, killed_by_us: bool,
               kernel_oom: str | None = None, limit_hit: LimitHit | None = None) -> Judgement:
        """Judge how the process ended; ``check()`` returns this from now on.  ``kernel_oom``: the
        kernel's report of an OOM kill of the attempt, if it made one; ``limit_hit``: one of its own
        `[limits]` the kernel enforced, if any."""
        self._final = judge_exit(self._facts, returncode, signal, killed_by_us, self._last_unhealthy, kernel_oom,
                                 limit_hit)
        return self._final

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now
