"""Per-attempt health judgement.

A ``Watchdog`` folds one attempt's probe events (phases, progress bars, failures,
heartbeats) and the arrival of any output into a small state, and judges it against
the job's ``HealthSpec`` with an injectable clock:

- ``check()`` while the process runs: healthy, stalled (stuck progress or a phase past
  its deadline), silent (no output at all for too long) or crashed/oom (a failure was
  logged and the process has hung since: the surviving ranks of a dead one);
- ``exited()`` once it has ended: done, crashed or oom.

Nothing here sleeps or polls: ``next_check_at()`` says when the verdict could next
change with no new event, so the daemon sleeps exactly until then (or until the next
event, after which it asks again).
"""

from __future__ import annotations

import bisect
import signal as signal_module
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .events import Event, EventKind, FailureKind, Phase, Verdict
from .spec import HealthSpec

# Enough intervals for a stable median without letting a million-step training bar grow
# memory without bound.
_MAX_INTERVALS = 256  # the median of the recent intervals: adapts, and stays cheap to recompute
_TRACEBACK_TAIL_LINES = 15
# A program that logs the same error in a loop must not grow the watchdog without bound.
_MAX_FAILURES_KEPT = 20
_SIGKILL = int(signal_module.SIGKILL)
_SURVIVABLE_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class ProgressState:
    """Where one progress probe stands.  ``rate`` is the median seconds per item."""

    probe: str
    done: int
    total: int | None
    rate: float | None
    eta_s: float | None
    last_advance_at: float


@dataclass
class _Track:
    """One progress bar being watched: when it last advanced and how fast it goes."""

    probe: str
    done: int
    total: int | None
    last_advance_at: float
    retired: bool = False  # its phase is over: shown as the last progress, no longer watched
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_INTERVALS))
    per_item: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_INTERVALS))
    # Sorted copies of the two windows: the daemon asks for the bound after every event.
    _intervals_sorted: list[float] = field(default_factory=list)
    _per_item_sorted: list[float] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total

    def advance(self, done: int, at: float) -> None:
        interval = at - self.last_advance_at
        _push(self.intervals, self._intervals_sorted, interval)
        _push(self.per_item, self._per_item_sorted, interval / (done - self.done))
        self.done = done
        self.last_advance_at = at

    def median_interval(self) -> float | None:
        return _median(self._intervals_sorted)

    def rate(self) -> float | None:
        return _median(self._per_item_sorted)


def _push(window: deque[float], ordered: list[float], value: float) -> None:
    """Append to a bounded window, keeping a sorted copy of it: a fast bar advances hundreds of
    times a second, and the median is asked for after each advance."""
    if len(window) == window.maxlen:
        del ordered[bisect.bisect_left(ordered, window[0])]
    window.append(value)
    bisect.insort(ordered, value)


def _median(ordered: list[float]) -> float | None:
    n = len(ordered)
    if n == 0:
        return None
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class _Condition:
    """A rule that is violated from ``deadline`` on unless an event changes the state."""

    deadline: float
    verdict: Verdict
    describe: Callable[[float], tuple[str, dict[str, Any]]]


class Watchdog:
    """Judges one attempt; feed it events in arrival order."""

    def __init__(self, health: HealthSpec, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._health = health
        self._clock = clock
        self._started_at = clock()
        self._last_output_at = self._started_at
        # Output other than "still waiting" lines, and the latest of those lines.
        self._last_active_at = self._started_at
        self._heartbeat: tuple[float, str] | None = None
        self._phase: Phase | None = None
        self._phase_entered_at = self._started_at
        self._phase_has_progress = False
        self._tracks: dict[str, _Track] = {}
        self._latest_probe: str | None = None
        self._failures: list[dict[str, Any]] = []
        self._advanced_since_failure = True
        # The first failure since the last advance not logged below ERROR: what a hang after it
        # is blamed on.
        self._unrecovered_failure: dict[str, Any] | None = None
        self._failure_count = 0
        self._oom: dict[str, Any] | None = None
        self._final: Judgement | None = None
        self._last_unhealthy: Judgement | None = None

    # ---- state -------------------------------------------------------------------

    @property
    def phase(self) -> Phase | None:
        return self._phase

    @property
    def progress(self) -> ProgressState | None:
        """The progress bar that moved most recently (finished and earlier-phase bars included)."""
        track = self._tracks.get(self._latest_probe or "")
        if track is None:
            return None
        rate = track.rate()
        eta = None
        if rate is not None and track.total is not None:
            eta = max(0, track.total - track.done) * rate
        return ProgressState(track.probe, track.done, track.total, rate, eta, track.last_advance_at)

    @property
    def phase_entered_at(self) -> float:
        """Clock time the current phase began (the attempt's start before any phase)."""
        return self._phase_entered_at

    @property
    def last_output_at(self) -> float:
        """Clock time of the latest output (the attempt's start before any)."""
        return self._last_output_at

    @property
    def failures(self) -> list[dict[str, Any]]:
        return list(self._failures)

    # ---- input -------------------------------------------------------------------

    def output_seen(self, now: float | None = None, *, heartbeats_only: bool = False) -> None:
        """Records arrived: the process is not silent.  ``heartbeats_only``: they were all
        "still waiting" lines, which show it alive but not doing anything."""
        at = self._now(now)
        self._last_output_at = at
        if not heartbeats_only:
            self._last_active_at = at

    def observe(self, event: Event, now: float | None = None) -> None:
        at = self._now(now)
        # Every probe event comes from a record, so it is output too.
        self._last_output_at = at
        if event.kind == EventKind.INFO and event.data.get("heartbeat"):
            self._heartbeat = (at, event.message)
        else:
            self._last_active_at = at
        phase = event.phase or _as_phase(event.data.get("phase"))
        if phase is not None and event.kind in (EventKind.PHASE, EventKind.PROGRESS):
            self._enter_phase(phase, at)
        if event.kind == EventKind.PROGRESS:
            self._progress(event, at)
        elif event.kind == EventKind.FAILURE:
            self._failure(_failure_record(event))
        # INFO (heartbeats included) and METRIC events only count as output: a process
        # that says "still waiting" is alive but has not made progress.

    def _enter_phase(self, phase: Phase, at: float) -> None:
        # Phases only move forward: with tensor parallelism every rank prints the same
        # phase lines at slightly different times, and a late rank must not rewind the job.
        if self._phase is not None and phase.rank <= self._phase.rank:
            return
        self._phase = phase
        self._phase_entered_at = at
        self._phase_has_progress = False
        self._advanced_since_failure = True
        self._unrecovered_failure = None
        # Bars of earlier phases are over even if they never printed their last step
        # (tqdm with leave=False, or a bar that stops at 99%); watching them would flag
        # a healthy run forever.
        for track in self._tracks.values():
            track.retired = True

    def _failure(self, record: dict[str, Any]) -> None:
        # A traceback the program itself logged below ERROR is one it means to survive: it does
        # not make a quiet process look hung.
        if self._unrecovered_failure is None and record["level"] not in _SURVIVABLE_LEVELS:
            self._unrecovered_failure = record
        self._advanced_since_failure = False
        self._failure_count += 1
        if len(self._failures) < _MAX_FAILURES_KEPT:
            self._failures.append(record)
        if self._oom is None and record["failure"] == FailureKind.CUDA_OOM:
            self._oom = record

    def _progress(self, event: Event, at: float) -> None:
        probe = event.probe or "progress"
        done = _as_int(event.data.get("done"))
        if done is None:
            return
        total = _as_int(event.data.get("total"))
        self._phase_has_progress = True
        self._latest_probe = probe
        track = self._tracks.get(probe)
        if track is None or track.retired or done < track.done:
            # First sight of this bar, or a new bar of the same probe (it went backwards).
            self._tracks[probe] = _Track(probe, done, total, at)
            return
        if total is not None:
            track.total = total
        if done == track.done:
            return  # a redraw of the same step (or the 100% bar printed twice) is no advance
        track.advance(done, at)
        self._advanced_since_failure = True
        self._unrecovered_failure = None

    # ---- judgement while running ---------------------------------------------------

    def check(self, now: float | None = None) -> Judgement:
        if self._final is not None:
            return self._final
        at = self._now(now)
        violated = [c for c in self._conditions() if at >= c.deadline]
        if not violated:
            self._last_unhealthy = None
            return Judgement(Verdict.HEALTHY, self._healthy_reason(), self._healthy_evidence(at))
        # The rule broken first wins, so the verdict does not flip as more rules break.
        first = min(violated, key=lambda c: (c.deadline, c.verdict != Verdict.STALLED))
        reason, evidence = first.describe(at)
        others = [c.describe(at)[0] for c in violated if c is not first]
        if others:
            evidence = {**evidence, "also": others}
        judgement = Judgement(first.verdict, reason, evidence)
        self._last_unhealthy = judgement
        return judgement

    def next_check_at(self, now: float | None = None) -> float | None:
        """The earliest clock time at which ``check()`` could change with no new event."""
        if self._final is not None:
            return None
        at = self._now(now)
        pending = [c.deadline for c in self._conditions() if c.deadline > at]
        return min(pending) if pending else None

    def upcoming(self, now: float | None = None) -> tuple[float, Verdict, str] | None:
        """The rule that comes due first if nothing changes: its clock deadline, the verdict it
        would give and the reason it would give then.  None when no rule is pending."""
        if self._final is not None:
            return None
        at = self._now(now)
        pending = [c for c in self._conditions() if c.deadline > at]
        if not pending:
            return None
        first = min(pending, key=lambda c: c.deadline)
        return first.deadline, first.verdict, first.describe(first.deadline)[0]

    def _conditions(self) -> list[_Condition]:
        watched = [t for t in self._tracks.values() if not (t.finished or t.retired)]
        conditions = [self._stall_condition(t) for t in watched]
        conditions.extend(self._first_progress_condition())
        conditions.extend(self._deadline_condition())
        conditions.extend(self._silence_condition())
        conditions.extend(self._hang_after_failure_condition())
        conditions.extend(self._waiting_condition())
        return conditions

    def _stall_condition(self, track: _Track) -> _Condition:
        bound, how = self._stall_bound(track)
        # The deadline is computed once, here, and compared with >= everywhere, so the
        # daemon waking exactly at next_check_at() sees the violation (no float slack).
        deadline = track.last_advance_at + bound

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            stalled = at - track.last_advance_at
            median = track.median_interval()
            where = f"{_label(track.probe)} {track.done}/{track.total if track.total is not None else '?'}"
            reason = f"{where}, no progress for {format_duration(stalled)} ({how})"
            evidence: dict[str, Any] = {
                "probe": track.probe,
                "done": track.done,
                "total": track.total,
                "stalled_s": round(stalled, 3),
                "median_interval_s": None if median is None else round(median, 3),
                "bound_s": round(bound, 3),
                "phase": self._phase_name(),
            }
            return reason, evidence

        return _Condition(deadline, Verdict.STALLED, describe)

    def _stall_bound(self, track: _Track) -> tuple[float, str]:
        floor = self._health.stall_floor(self._phase)
        median = track.median_interval()
        if median is None:
            first = self._health.first_progress_s.get(self._phase) if self._phase else None
            if first is not None:
                return first, f"bound {first:.1f}s: first advance expected within {format_duration(first)}"
            return floor, f"bound {floor:.1f}s = stall floor, no interval measured yet"
        k = self._health.stall_k
        scaled = k * median
        if scaled >= floor:
            return scaled, f"bound {scaled:.1f}s = {k:g} x median {median:.1f} s/it"
        return floor, f"bound {floor:.1f}s = stall floor; {k:g} x median {median:.2f} s/it is less"

    def _first_progress_condition(self) -> list[_Condition]:
        # A phase expected to show progress that shows none at all (the bar never drew).
        if self._phase is None or self._phase_has_progress:
            return []
        limit = self._health.first_progress_s.get(self._phase)
        if limit is None:
            return []
        entered = self._phase_entered_at

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            waited = at - entered
            reason = (
                f"phase {self._phase_name()}: no progress shown for {format_duration(waited)} "
                f"(first progress expected within {format_duration(limit)})"
            )
            return reason, {"phase": self._phase_name(), "waited_s": round(waited, 3), "bound_s": limit}

        return [_Condition(entered + limit, Verdict.STALLED, describe)]

    def _deadline_condition(self) -> list[_Condition]:
        if self._phase is None or self._phase not in self._health.phase_deadline_s:
            return []
        limit = self._health.phase_deadline_s[self._phase]
        entered = self._phase_entered_at

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            spent = at - entered
            reason = (
                f"phase {self._phase_name()} exceeded its deadline of {format_duration(limit)} "
                f"(in it for {format_duration(spent)})"
            )
            return reason, {"phase": self._phase_name(), "in_phase_s": round(spent, 3), "deadline_s": limit}

        return [_Condition(entered + limit, Verdict.STALLED, describe)]

    def _silence_condition(self) -> list[_Condition]:
        limit = self._health.silence_s
        if limit is None or self._phase not in self._health.silence_phases:
            return []
        last = self._last_output_at

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            quiet = at - last
            reason = (
                f"no output for {format_duration(quiet)} in phase {self._phase_name()} "
                f"(limit {format_duration(limit)})"
            )
            return reason, {"phase": self._phase_name(), "silent_s": round(quiet, 3), "silence_s": limit}

        return [_Condition(last + limit, Verdict.SILENT, describe)]

    def _hang_after_failure_condition(self) -> list[_Condition]:
        # A phase change or a progress step after the failure means the process recovered
        # (vLLM logs a full traceback at WARNING during a healthy start, then becomes ready).
        limit = self._health.hang_after_failure_s
        failure = self._unrecovered_failure
        # A ready server that logged one failed request and then idles is not hung; when its
        # engine dies, vLLM exits and the exit is judged.
        if limit is None or failure is None or self._phase is Phase.ENGINE_READY:
            return []
        last = self._last_active_at  # "still waiting" lines after a failure are the hang itself
        verdict = Verdict.OOM if failure["failure"] == FailureKind.CUDA_OOM else Verdict.CRASHED

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            quiet = at - last
            reason = f"hung after a failure, no output for {format_duration(quiet)}: {failure['line']}"
            evidence = {
                "phase": self._phase_name(), "silent_s": round(quiet, 3), "hang_after_failure_s": limit,
                "failure": failure["failure"], "line": failure["line"], "fingerprint": failure["fingerprint"],
                "traceback_tail": failure["traceback_tail"], "failures_seen": self._failure_count,
            }
            return reason, evidence

        return [_Condition(last + limit, verdict, describe)]

    def _waiting_condition(self) -> list[_Condition]:
        # Before any phase is recognised nothing is known about the program: no rule.
        limit = self._health.waiting_s
        if limit is None or self._phase not in self._health.waiting_phases:
            return []
        since = self._last_active_at
        heartbeat = self._heartbeat if self._heartbeat and self._heartbeat[0] >= since else None

        def describe(at: float) -> tuple[str, dict[str, Any]]:
            waited = format_duration(at - since)
            where = f"in start-up phase {self._phase_name()} (limit {format_duration(limit)})"
            if heartbeat is not None:
                reason = f"only 'still waiting' lines for {waited} {where}: {heartbeat[1]}"
            else:
                reason = f"no output for {waited} {where}"
            evidence = {"phase": self._phase_name(), "waiting_s": round(at - since, 3), "limit_s": limit,
                        "line": heartbeat[1] if heartbeat else None}
            return reason, evidence

        return [_Condition(since + limit, Verdict.STALLED, describe)]

    def _healthy_reason(self) -> str:
        progress = self.progress
        where = f"phase {self._phase_name()}"
        if progress is not None:
            total = progress.total if progress.total is not None else "?"
            where += f", {_label(progress.probe)} {progress.done}/{total}"
        return where

    def _healthy_evidence(self, at: float) -> dict[str, Any]:
        evidence: dict[str, Any] = {
            "phase": self._phase_name(),
            "last_output_s": round(at - self._last_output_at, 3),
        }
        progress = self.progress
        if progress is not None:
            evidence.update(probe=progress.probe, done=progress.done, total=progress.total)
        return evidence

    # ---- judgement at exit ------------------------------------------------------------

    def exited(self, returncode: int | None, signal: int | None, killed_by_us: bool) -> Judgement:
        """Judge how the process ended; ``check()`` returns this from now on."""
        signal = _exit_signal(returncode, signal)
        evidence = self._exit_evidence(returncode, signal)
        self._final = self._exit_judgement(returncode, signal, killed_by_us, evidence)
        return self._final

    def _exit_judgement(
        self, returncode: int | None, signal: int | None, killed_by_us: bool, evidence: dict[str, Any]
    ) -> Judgement:
        failure = self._primary_failure()
        oom = self._oom_failure()
        how = _describe_exit(returncode, signal)
        if killed_by_us and self._last_unhealthy is not None and oom is None:
            # We stopped it because of what check() found: that is the verdict that counts,
            # however the process then ended.
            prior = self._last_unhealthy
            return Judgement(prior.verdict, prior.reason, {**prior.evidence, **evidence})
        if returncode == 0 and signal is None:
            if failure is None:
                return Judgement(Verdict.DONE, "exited 0", evidence)
            if self._advanced_since_failure:
                # It logged an error, then made progress again and finished: a recovery.
                return Judgement(Verdict.DONE, f"exited 0; recovered after logging: {failure['line']}", evidence)
            # Exit 0 straight after a failure is a shutdown, not success: `vllm serve` exits 0
            # after "Worker proc VllmWorker-1 died unexpectedly" and EngineDeadError (seen on 2 H200s).
            return Judgement(Verdict.CRASHED, f"exited 0 right after a failure: {failure['line']}", evidence)
        if oom is not None:
            return Judgement(Verdict.OOM, f"CUDA out of memory ({how}): {oom['line']}", evidence)
        if signal == _SIGKILL and not killed_by_us:
            reason = "killed by SIGKILL not sent by the supervisor (kernel OOM killer?)"
            return Judgement(Verdict.OOM, reason, evidence)
        if failure is not None:
            return Judgement(Verdict.CRASHED, f"{how}: {failure['line']}", evidence)
        if killed_by_us:
            return Judgement(Verdict.CRASHED, f"stopped by the supervisor ({how})", evidence)
        return Judgement(Verdict.CRASHED, f"{how}, no error line recognised in the log", evidence)

    def _exit_evidence(self, returncode: int | None, signal: int | None) -> dict[str, Any]:
        evidence: dict[str, Any] = {
            "returncode": returncode,
            "signal": signal,
            "signal_name": _signal_name(signal),
            "phase": self._phase_name(),
        }
        progress = self.progress
        if progress is not None:
            evidence["progress"] = {"probe": progress.probe, "done": progress.done, "total": progress.total}
        failure = self._oom_failure() or self._primary_failure()
        if failure is not None:
            evidence.update(
                failure=failure["failure"],
                line=failure["line"],
                fingerprint=failure["fingerprint"],
                traceback_tail=failure["traceback_tail"],
                failures_seen=self._failure_count,
            )
        return evidence

    def _primary_failure(self) -> dict[str, Any] | None:
        # The first failure is usually the cause; later ones are other ranks or the
        # parent reporting that a worker died.
        return self._failures[0] if self._failures else None

    def _oom_failure(self) -> dict[str, Any] | None:
        return self._oom

    # ---- helpers -------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _phase_name(self) -> str | None:
        return None if self._phase is None else self._phase.value


def format_duration(seconds: float) -> str:
    """45.0s, 3m10s, 2h05m: short enough for an alert title."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _label(probe: str) -> str:
    # "vllm.shards" -> "shard": the probe id names what is being counted.
    name = probe.rsplit(".", 1)[-1]
    return name[:-1] if name.endswith("s") and len(name) > 1 else name


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


def _failure_record(event: Event) -> dict[str, Any]:
    data = event.data
    traceback = data.get("traceback") or ""
    tail = "\n".join(str(traceback).splitlines()[-_TRACEBACK_TAIL_LINES:])
    kind = data.get("failure") or FailureKind.OTHER
    try:
        kind = FailureKind(kind)
    except ValueError:
        kind = FailureKind.OTHER
    return {
        "failure": kind,
        "line": data.get("line") or event.message,
        "fingerprint": data.get("fingerprint"),
        "traceback_tail": tail,
        "probe": event.probe,
        "level": data.get("level"),
    }


def _exit_signal(returncode: int | None, signal: int | None) -> int | None:
    # A shell reports death by signal N as status 128+N, and subprocess as -N.
    if signal is not None:
        return signal
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode <= 128 + 64:
        return returncode - 128
    return None


def _signal_name(signal: int | None) -> str | None:
    if signal is None:
        return None
    try:
        return signal_module.Signals(signal).name
    except ValueError:
        return f"signal {signal}"


def _describe_exit(returncode: int | None, signal: int | None) -> str:
    if signal is not None:
        return f"killed by {_signal_name(signal)}"
    if returncode is None:
        return "exited with unknown status"
    return f"exited {returncode}"
