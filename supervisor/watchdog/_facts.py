"""What the watchdog has seen of one attempt: its events folded into a small state.

Folding knows nothing of rules or verdicts; ``_rules`` reads these facts to decide what is
due when, and ``_exit`` to judge how the process ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..events import Event, EventKind, Failure, FailureKind, Phase
from ._progress import ProgressState, Track

# A program that logs the same error in a loop must not grow the watchdog without bound.
_MAX_FAILURES_KEPT = 20


@dataclass
class Facts:
    """One attempt's folded events.  Times are the watchdog's clock."""

    started_at: float
    last_output_at: float = field(init=False)
    # Output other than "still waiting" lines, and the latest of those lines.
    last_active_at: float = field(init=False)
    heartbeat: tuple[float, str] | None = None
    phase: Phase | None = None
    phase_entered_at: float = field(init=False)  # the attempt's start before any phase
    phase_has_progress: bool = False
    tracks: dict[str, Track] = field(default_factory=dict)
    latest_probe: str | None = None
    failures: list[Failure] = field(default_factory=list)  # the first ones, in order
    last_failure: Failure | None = None
    failure_count: int = 0
    advanced_since_failure: bool = True
    # The first failure since the last advance not logged below ERROR: what a hang after it
    # is blamed on.
    unrecovered_failure: Failure | None = None
    oom: Failure | None = None

    def __post_init__(self) -> None:
        self.last_output_at = self.last_active_at = self.phase_entered_at = self.started_at

    # ---- reading ---------------------------------------------------------------------

    @property
    def phase_name(self) -> str | None:
        return None if self.phase is None else self.phase.value

    @property
    def progress(self) -> ProgressState | None:
        """The progress bar that moved most recently (finished and earlier-phase bars included)."""
        track = self.tracks.get(self.latest_probe or "")
        return None if track is None else track.state()

    @property
    def primary_failure(self) -> Failure | None:
        # The first failure is usually the cause; later ones are other ranks or the
        # parent reporting that a worker died.
        return self.failures[0] if self.failures else None

    # ---- folding ---------------------------------------------------------------------

    def output_seen(self, at: float, *, heartbeats_only: bool = False) -> None:
        self.last_output_at = at
        if not heartbeats_only:
            self.last_active_at = at

    def observe(self, event: Event, at: float) -> None:
        # Every probe event comes from a record, so it is output too.
        self.last_output_at = at
        if event.kind == EventKind.INFO and event.data.get("heartbeat"):
            self.heartbeat = (at, event.message)
        else:
            self.last_active_at = at
        phase = event.phase or _as_phase(event.data.get("phase"))
        if phase is not None and event.kind in (EventKind.PHASE, EventKind.PROGRESS):
            self._enter_phase(phase, at)
        if event.kind == EventKind.PROGRESS:
            self._progress(event, at)
        elif event.kind == EventKind.FAILURE:
            self._failure(event.failure or Failure(FailureKind.OTHER, event.message))
        # INFO (heartbeats included) and METRIC events only count as output: a process
        # that says "still waiting" is alive but has not made progress.

    def _enter_phase(self, phase: Phase, at: float) -> None:
        # Phases only move forward: with tensor parallelism every rank prints the same
        # phase lines at slightly different times, and a late rank must not rewind the job.
        if self.phase is not None and phase.rank <= self.phase.rank:
            return
        self.phase = phase
        self.phase_entered_at = at
        self.phase_has_progress = False
        self._advanced()
        # Bars of earlier phases are over even if they never printed their last step
        # (tqdm with leave=False, or a bar that stops at 99%); watching them would flag
        # a healthy run forever.
        for track in self.tracks.values():
            track.retired = True

    def _failure(self, failure: Failure) -> None:
        # A traceback the program itself logged below ERROR is one it means to survive: it does
        # not make a quiet process look hung.
        if self.unrecovered_failure is None and not failure.survivable:
            self.unrecovered_failure = failure
        self.advanced_since_failure = False
        self.failure_count += 1
        self.last_failure = failure
        if len(self.failures) < _MAX_FAILURES_KEPT:
            self.failures.append(failure)
        if self.oom is None and failure.kind == FailureKind.CUDA_OOM:
            self.oom = failure

    def _progress(self, event: Event, at: float) -> None:
        probe = event.probe or "progress"
        done = _as_int(event.data.get("done"))
        if done is None:
            return
        total = _as_int(event.data.get("total"))
        self.phase_has_progress = True
        self.latest_probe = probe
        track = self.tracks.get(probe)
        if track is None or track.retired or done < track.done:
            # First sight of this bar, or a new bar of the same probe (it went backwards).
            self.tracks[probe] = Track(probe, done, total, at)
            return
        if total is not None:
            track.total = total
        if done == track.done:
            return  # a redraw of the same step (or the 100% bar printed twice) is no advance
        track.advance(done, at)
        self._advanced()

    def _advanced(self) -> None:
        # A phase change or a progress step after a failure means the process recovered.
        self.advanced_since_failure = True
        self.unrecovered_failure = None


def _as_int(value: Any) -> int | None:
    # Probe fields may arrive as regex captures (strings).
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _as_phase(value: Any) -> Phase | None:
    if value is None:
        return None
    try:
        return Phase(value)
    except ValueError:
        return None
