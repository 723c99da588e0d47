"""What the watchdog has seen of one attempt: its events folded into a small state.

Folding knows nothing of rules or verdicts; ``_rules`` reads these facts to decide what is
due when, and ``_exit`` to judge how the process ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.events import Event, EventKind, Failure, FailureKind, Phase, ProbeKind
from supervisor.core.payloads import ProbeFields
from supervisor.probes import (
    BarBook,
    BarRun,
    bar_of,
    echoes_only,
    ends_attempt,
    entered_phase,
    entering_recovers,
    goes_on_serving,
    implied_phase,
    root_cause,
    starts_new_attempt,
    survived,
)
from supervisor.watchdog._divergence import LossTrack
from supervisor.watchdog._idle import GpuUse
from supervisor.watchdog._pace import PaceHistory, bar_key
from supervisor.watchdog._progress import ProgressState, Track
from supervisor.watchdog._redraws import Redraws
from supervisor.watchdog._serving import EngineLoad
from supervisor.watchdog._straggler import StragglerWatch
from supervisor.watchdog._tail import LogTail

_PROBE_KINDS = frozenset(k.value for k in ProbeKind)
# A program that logs the same error in a loop must not grow the watchdog without bound.
_MAX_FAILURES_KEPT = 20


@dataclass(frozen=True, slots=True)
class Paused:
    """A wait the program announces and repeats (``paused`` heartbeats): neither progress nor a stall."""

    since: float  # the first line of this wait
    latest: float  # the latest one: the stall clocks count from here while it lasts
    line: str


@dataclass
class Facts:
    """One attempt's folded events.  Times are the watchdog's clock."""

    started_at: float
    last_output_at: float = field(init=False)
    # Output other than "still waiting" lines, and the latest of those lines.
    last_active_at: float = field(init=False)
    heartbeat: tuple[float, str] | None = None
    # A known wait (``paused`` heartbeats, e.g. an extraction waiting on its disk budget): since when, the
    # latest such line's time and text; None once anything else happens (a step, a phase, an info line).
    paused: Paused | None = None
    # When the latest such wait ended (the line after it): the stall clocks count from there, not from before it.
    wait_ended_at: float | None = None
    # The latest `WATCHDOG=1` the program sent to its NOTIFY_SOCKET: alive, though it may print nothing.
    pinged_at: float | None = None
    # When a new daemon began to listen for them (re-adopted): pings sent before were never heard.
    pings_heard_from: float | None = None
    phase: Phase | None = None
    phase_entered_at: float = field(init=False)  # the attempt's start before any phase
    phase_has_progress: bool = False
    # One stall track per bar (``BarBook``: a probe's bars told apart by description and
    # process), by bar id; only the book's recent bars keep a track.
    bars: BarBook = field(default_factory=BarBook)
    tracks: dict[int, Track] = field(default_factory=dict)
    latest_bar: int | None = None
    failures: list[Failure] = field(default_factory=list)  # the first ones, in order
    # The first ones since the last advance: the root cause when there are any (a failure the
    # program went on from explains nothing that came after), as the offline replay reads it.
    failures_since_advance: list[Failure] = field(default_factory=list)
    failures_before_advance: list[Failure] = field(default_factory=list)  # those the last advance cleared
    # The log generation the kept failures come from: a truncated or rotated log is a new log,
    # and the root cause is sought in the log as it now stands (a failure after truncation is
    # not a consequence of one the program wrote over).
    failures_generation: int = 0
    last_failure: Failure | None = None
    failure_count: int = 0
    advanced_since_failure: bool = True
    since_advance: int = 0  # failures kept before the last advance (phase change or progress step)
    # The first failure since the last advance not logged below ERROR, should the list be full.
    _first_unrecovered: Failure | None = None
    _attempt_over: bool = False  # a launcher said the workers' attempt failed (``attempt_over`` probes)
    oom: Failure | None = None
    # A failure after which the program cannot do its work whatever it prints next (``fatal``
    # probes: vLLM's engine dead behind an API server that still answers), and when it came.
    fatal: tuple[float, Failure] | None = None
    history: PaceHistory = field(default_factory=PaceHistory)  # earlier attempts' bar paces
    engine: EngineLoad = field(default_factory=EngineLoad)  # a serving engine's throughput lines
    loss: LossTrack = field(default_factory=LossTrack)  # a training loss, wherever a line carries one
    gpu: GpuUse = field(default_factory=GpuUse)  # the attempt's GPUs' utilisation, as samples showed it
    moved_at: float = field(init=False)  # the latest progress step or new phase (the start before any)
    # Whether a line named the phase (or a bar implied it), not only a failure's fallback (start-up, for a program
    # that failed before saying anything of itself): nothing is known of such a program, and the rules for a
    # program in a known phase (silence by phase, start-up waiting) do not apply to it.
    phase_named: bool = False
    stragglers: StragglerWatch = field(default_factory=StragglerWatch)  # ranks behind their peers, now
    tail: LogTail = field(default_factory=LogTail)  # the log's last lines: the evidence when no probe knew the cause
    # The plain info line that last changed nothing here (its probe, phase and fields), with what its folding
    # read of the state then (the phase, whether advanced since a failure): while that state stands, the same
    # line at the time of the latest output changes nothing again (``unchanged_by``).
    _inert_info: tuple[str | None, Phase | None, dict[str, Any], Phase | None, bool] | None = None

    def __post_init__(self) -> None:
        self.last_output_at = self.last_active_at = self.phase_entered_at = self.moved_at = self.started_at

    # ---- reading ---------------------------------------------------------------------

    @property
    def phase_name(self) -> str | None:
        return None if self.phase is None else self.phase.value

    @property
    def known_phase(self) -> Phase | None:
        """The phase the program's own lines put it in; None before any, and while only a failure's fallback did."""
        return self.phase if self.phase_named else None

    @property
    def progress(self) -> ProgressState | None:
        """The progress bar that moved most recently (finished and earlier-phase bars included)."""
        track = self.tracks.get(self.latest_bar) if self.latest_bar is not None else None
        return None if track is None else track.state()

    @property
    def primary_failure(self) -> Failure | None:
        """The root cause: later failures are other ranks, or parents and launchers reporting
        that a worker died (``probes.root_cause``).  The attempt's failure as stored."""
        if self.fatal is not None:  # never gone on from: the engine is dead whatever prints next
            return root_cause(self.failures)
        since = self.failures_since_advance
        if echoes_only(since) and self.failures_before_advance:  # a summary of a crash a late step came between
            since = self.failures_before_advance + since
        return root_cause(since or self.failures)

    @property
    def unrecovered_failure(self) -> Failure | None:
        """The root cause among failures since the last advance not logged below ERROR: what a
        hang after them is blamed on."""
        recent = [f for f in self.failures[self.since_advance:] if not f.survivable]
        return root_cause(recent) if recent else self._first_unrecovered

    # ---- folding ---------------------------------------------------------------------

    def output_seen(self, at: float, *, heartbeats_only: bool = False) -> None:
        self.last_output_at = at
        if not heartbeats_only:
            self.last_active_at = at

    def pinged(self, at: float) -> None:
        self.pinged_at = at if self.pinged_at is None else max(self.pinged_at, at)

    def observe(self, event: Event, at: float) -> bool:
        """Fold one event in.  Returns False only when the event was a plain info line (no
        failure, no heartbeat) that changed nothing here: then the same line again at the same
        time changes nothing either (a vLLM server's access log, one line per request)."""
        # Every probe event comes from a record, so it is output too.  The batch it came in may
        # have been dated later than it (a log read back after a daemon restart): never earlier.
        changed = at > self.last_output_at or at != self.last_active_at
        self.last_output_at = max(self.last_output_at, at)
        payload = ProbeFields.of(event)
        # The probes' own rules read the pack's named captures, so they get them as captured.
        fields = payload.fields
        if event.kind == EventKind.INFO and payload.heartbeat:
            self.heartbeat = (at, event.message)
            if payload.paused:
                self.paused = Paused(at if self.paused is None else self.paused.since, at, event.message)
            changed = True
        else:
            self.last_active_at = at
            if self.paused is not None:
                self.paused, self.wait_ended_at = None, at
        # Any event that implies a phase enters it, as the offline replay reads it (``entered_phase``).
        kind = ProbeKind(event.kind.value) if event.kind.value in _PROBE_KINDS else ProbeKind.INFO
        own = event.phase or payload.phase
        implied = implied_phase(kind, own, self.phase)
        if implied is not None:
            # A failure's fallback phase (start-up) says nothing of bars drawn before it: they go on being watched.
            changed |= self._enter_phase(implied, at, recovers=entering_recovers(kind, fields), named=own is not None)
        if not self.advanced_since_failure and goes_on_serving(fields):
            self._advanced()  # a request answered after the failure: it was one call's, the server goes on
            changed = True
        if event.kind in (EventKind.METRIC, EventKind.PROGRESS) and fields:
            self.engine.observe(fields, at)
            self.loss.observe(fields, at)
        if event.kind == EventKind.PROGRESS:
            self._progress(event.probe or "progress", payload, at)
        elif event.kind == EventKind.FAILURE:
            if event.generation > self.failures_generation:
                self.failures_generation = event.generation
                self.failures, self.since_advance, self._first_unrecovered = [], 0, None
                self.failures_since_advance, self.failures_before_advance = [], []
                self.fatal = None
            failure = event.failure or Failure(FailureKind.OTHER, event.message)
            if starts_new_attempt(self._attempt_over, failure):  # the launcher restarted the workers
                self.failures_before_advance, self.failures_since_advance = self.failures_since_advance, []
            self._attempt_over = ends_attempt(self._attempt_over, failure, fields)
            self._failure(failure, at)
        # INFO (heartbeats included) and METRIC events only count as output: a process
        # that says "still waiting" is alive but has not made progress.
        changed = changed or event.kind is not EventKind.INFO or event.failure is not None
        if not changed:
            # A copy: the event's fields go on to the store, and what is remembered must not change with them.
            self._inert_info = (event.probe, event.phase, dict(event.data), self.phase, self.advanced_since_failure)
        return changed

    def unchanged_by(self, probe: str | None, phase: Phase | None, fields: Mapping[str, Any], at: float) -> bool:
        """Whether a plain info line (no failure) of ``probe`` with ``fields`` at ``at`` would change
        nothing here: it is the line that last changed nothing (``observe`` returned False), the state
        its folding reads is as it left it, and ``at`` is the latest output's time.  Exact: such a
        line at such a time only sets what is already set."""
        inert = self._inert_info
        return (inert is not None and at == self.last_output_at and at == self.last_active_at and self.paused is None
                and inert[0] == probe and inert[1] is phase and inert[3] is self.phase
                and inert[4] == self.advanced_since_failure and inert[2] == fields)

    def redrawn(self, run: Redraws, at: float) -> bool:
        """Fold in a run of redraws read at ``at`` (``_redraws``) as its lines one by one would, and
        say True; or change nothing and say False when a line of it could do more than move the count
        of the bar the latest progress line drew (the caller then feeds the lines one by one)."""
        recent = self.bars.recent
        if not recent:
            return False
        book = recent[-1]  # the bar a line continues when it is the most recent one it fits
        track = self.tracks.get(book.id)
        if track is None or track.retired or self.latest_bar != book.id:
            return False
        bar, seen = book.bar, bar_of(run.probe, run.fields)
        if bar.probe != run.probe or bar.desc != seen.desc or (seen.process and bar.process != seen.process):
            return False  # another bar, or one that would learn its process from these lines
        if book.total != run.total or track.total != run.total:
            return False
        phase = run.phase  # (the phase it is in already: never entered again)
        if phase is not None and phase is not self.phase and any(entered_phase(self.phase, phase, recovered=r)
                                                                 is not None for r in (False, True)):
            return False  # a line would enter its phase (after an advance, when not before)
        dones = run.dones
        if dones and dones[0] < book.done:
            return False  # a count taken back starts another bar
        for i in range(1, len(dones)):
            if dones[i] < dones[i - 1]:
                return False
        self.last_output_at = max(self.last_output_at, at)
        self.last_active_at = at
        if self.paused is not None:
            self.paused, self.wait_ended_at = None, at
        self.phase_has_progress = True
        if dones:  # (a whole count: kept an int, as one line at a time leaves it, compiled or not)
            book.done = dones[-1]
        for done in run.dones:  # as ``_progress`` does for each line of a bar it tracks
            if done == track.done:
                continue
            track.advance(done, at)
            self.stragglers.stepped(book.id, track, self.tracks.values())
            self.moved_at = max(self.moved_at, at)
            self._advanced()
        return True

    def _enter_phase(self, implied: Phase | None, at: float, *, recovers: bool = True, named: bool = True) -> bool:
        """Whether the phase was entered (forward only, and no `done` straight after a failure:
        the rule the replay shares)."""
        phase = entered_phase(self.phase, implied, recovered=self.advanced_since_failure)
        if phase is None:
            return False
        self.phase = phase
        self.phase_named = named
        self.phase_entered_at = self.moved_at = at
        self.phase_has_progress = False
        if recovers:
            self._advanced()
        # Bars of earlier phases are over even if they never printed their last step
        # (tqdm with leave=False, or a bar that stops at 99%); watching them would flag
        # a healthy run forever.
        for track in self.tracks.values() if named else ():
            track.retired = True
        return True

    def _failure(self, failure: Failure, at: float) -> None:
        if failure.fatal and self.fatal is None:
            self.fatal = (at, failure)
        # A traceback the program itself logged below ERROR is one it means to survive: it does
        # not make a quiet process look hung.
        if self._first_unrecovered is None and not failure.survivable:
            self._first_unrecovered = failure
        if not survived(failure.survivable, self.phase):  # the rule the replay shares
            self.advanced_since_failure = False
        self.failure_count += 1
        self.last_failure = failure
        if len(self.failures) < _MAX_FAILURES_KEPT:
            self.failures.append(failure)
        if len(self.failures_since_advance) < _MAX_FAILURES_KEPT:
            self.failures_since_advance.append(failure)
        if self.oom is None and failure.kind == FailureKind.CUDA_OOM:
            self.oom = failure

    def _progress(self, probe: str, payload: ProbeFields, at: float) -> None:
        progress = payload.progress
        if progress is None:
            return
        # Tracks count whole steps: a fractional count (an epoch's 1.5) advances when it passes one.
        # An infinite count is no whole step: int() raises OverflowError, a fault in judging that the
        # runner contains and reports as an action (tests/test_containment_e2e.py provokes it so).
        done, total = int(progress.done), None if progress.total is None else int(progress.total)
        self.phase_has_progress = True
        run, new = self.bars.place(probe, payload.fields, done, total)
        self.latest_bar = run.id
        track = self.tracks.get(run.id)
        if track is None or track.retired:
            # First sight of this bar (a new bar of the same probe: another process, another
            # description, or counting from the start again), or one of an earlier phase.
            self.tracks[run.id] = Track(probe, done, total, at, bar=run.bar.label, key=bar_key(probe, run.bar.desc),
                                        process=run.bar.process)
            self.moved_at = max(self.moved_at, at)  # a bar drawn anew is work going on
            if new:
                self._new_bar(run)
            return
        track.bar = run.bar.label  # a bar first drawn without its process prefix learns it
        track.process = run.bar.process
        if total is not None:
            track.total = total
        if done == track.done:
            return  # a redraw of the same step (or the 100% bar printed twice) is no advance
        track.advance(done, at)
        self.stragglers.stepped(run.id, track, self.tracks.values())
        self.moved_at = max(self.moved_at, at)
        self._advanced()

    def paces(self) -> dict[str, list[float]]:
        """The intervals measured of each bar still tracked, by ``bar_key``: what is stored for
        the next attempt's bounds."""
        found: dict[str, list[float]] = {}
        for track in self.tracks.values():
            if track.intervals:
                found.setdefault(track.key, []).extend(track.intervals)
        return found

    def _new_bar(self, run: BarRun) -> None:
        # A bar drawn again from its start ends its earlier run (CUDA graphs' second pass, an
        # evaluation bar between training steps): that run may never print its last step.
        for earlier in self.bars.earlier_runs(run):
            if earlier in self.tracks:
                self.tracks[earlier].retired = True
        oldest = self.bars.recent[0].id
        for gone in [i for i in self.tracks if i < oldest]:
            del self.tracks[gone]
            self.stragglers.forget(gone)

    def _advanced(self) -> None:
        # A phase change or a progress step after a failure means the process recovered.
        self.advanced_since_failure = True
        self.since_advance = len(self.failures)
        if self.failures_since_advance:
            self.failures_before_advance, self.failures_since_advance = self.failures_since_advance, []
        self._first_unrecovered = None
