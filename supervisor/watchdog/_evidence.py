"""What a judgement rests on, as a typed value per rule (``Evidence``): the figures each rule
gives, named.  A judgement carries one within the process (the kill gate, the alerts, the slow
report read its fields); ``to_json()`` makes it the dict that is stored with the verdict's event
and sent, only there, with the same keys in the same order as each rule has always stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.core.events import FailureKind
from supervisor.core.payloads import SlowStep


@dataclass(frozen=True, slots=True)
class NoEvidence:
    """A judgement with nothing to show beyond its reason (GPU memory leaked)."""

    def to_json(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True, slots=True)
class BarAt:
    """Where a progress bar stood."""

    probe: str
    done: int | float
    total: int | float | None

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "done": self.done, "total": self.total}


@dataclass(frozen=True, slots=True)
class Blamed:
    """The failure a verdict is blamed on."""

    failure: FailureKind
    line: str
    fingerprint: str | None
    traceback_tail: str
    failures_seen: int

    def to_json(self) -> dict[str, Any]:
        return {"failure": self.failure, "line": self.line, "fingerprint": self.fingerprint,
                "traceback_tail": self.traceback_tail, "failures_seen": self.failures_seen}


@dataclass(frozen=True, slots=True)
class Healthy:
    phase: str | None
    last_output_s: float
    bar: BarAt | None = None
    paused_s: float | None = None  # with ``paused``: how long its "paused" lines have said so, and the last
    paused: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"phase": self.phase, "last_output_s": self.last_output_s}
        if self.bar is not None:
            data.update(self.bar.to_json())
        if self.paused_s is not None:
            data.update(paused_s=self.paused_s, paused=self.paused)
        return data


@dataclass(frozen=True, slots=True)
class Stalled:
    """A bar that stopped moving for longer than its bound."""

    probe: str
    bar: str
    done: int | float
    total: int | float | None
    stalled_s: float
    median_interval_s: float | None
    bound_s: float
    bound_source: str
    phase: str | None

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "bar": self.bar, "done": self.done, "total": self.total,
                "stalled_s": self.stalled_s, "median_interval_s": self.median_interval_s, "bound_s": self.bound_s,
                "bound_source": self.bound_source, "phase": self.phase}


@dataclass(frozen=True, slots=True)
class NoFirstProgress:
    phase: str | None
    waited_s: float
    bound_s: float

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "waited_s": self.waited_s, "bound_s": self.bound_s}


@dataclass(frozen=True, slots=True)
class PastDeadline:
    phase: str | None
    in_phase_s: float
    deadline_s: float

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "in_phase_s": self.in_phase_s, "deadline_s": self.deadline_s}


@dataclass(frozen=True, slots=True)
class Silent:
    phase: str | None
    silent_s: float
    silence_s: float

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "silent_s": self.silent_s, "silence_s": self.silence_s}


@dataclass(frozen=True, slots=True)
class Unpinged:
    phase: str | None
    unpinged_s: float
    watchdog_s: float
    ever_pinged: bool

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "unpinged_s": self.unpinged_s, "watchdog_s": self.watchdog_s,
                "ever_pinged": self.ever_pinged}


@dataclass(frozen=True, slots=True)
class HungAfterFailure:
    phase: str | None
    silent_s: float
    hang_after_failure_s: float
    blamed: Blamed

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "silent_s": self.silent_s, "hang_after_failure_s": self.hang_after_failure_s,
                **self.blamed.to_json()}


@dataclass(frozen=True, slots=True)
class EngineDead:
    phase: str | None
    since_fatal_s: float
    hang_after_failure_s: float
    fatal: str
    blamed: Blamed

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "since_fatal_s": self.since_fatal_s,
                "hang_after_failure_s": self.hang_after_failure_s, "fatal": self.fatal, **self.blamed.to_json()}


@dataclass(frozen=True, slots=True)
class StillWaiting:
    phase: str | None
    waiting_s: float
    limit_s: float
    line: str | None  # its last "still waiting" line, if it printed one

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "waiting_s": self.waiting_s, "limit_s": self.limit_s, "line": self.line}


@dataclass(frozen=True, slots=True)
class EngineHung:
    running: int
    waiting: int
    stuck_s: float
    hung_s: float
    throughput_lines: int

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": self.waiting, "stuck_s": self.stuck_s, "hung_s": self.hung_s,
                "throughput_lines": self.throughput_lines}


@dataclass(frozen=True, slots=True)
class Idle:
    gpus: tuple[int, ...]
    idle_s: float
    limit_s: float

    def to_json(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "idle_s": self.idle_s, "limit_s": self.limit_s}


@dataclass(frozen=True, slots=True)
class LossNotFinite:
    loss: str | float  # as the log wrote it (nan, inf)

    def to_json(self) -> dict[str, Any]:
        return {"loss": self.loss}


@dataclass(frozen=True, slots=True)
class Diverged:
    loss: float
    bound: float
    readings_over: int

    def to_json(self) -> dict[str, Any]:
        return {"loss": self.loss, "bound": self.bound, "readings_over": self.readings_over}


@dataclass(frozen=True, slots=True)
class PastMaxRuntime:
    phase: str | None
    runtime_s: float
    max_runtime_s: float

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "runtime_s": self.runtime_s, "max_runtime_s": self.max_runtime_s}


@dataclass(frozen=True, slots=True)
class LimitFigures:
    """One of the attempt's own `[limits]` the kernel enforced."""

    limit: str
    limit_value: int | float
    limit_events: int

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "limit_value": self.limit_value, "limit_events": self.limit_events}


@dataclass(frozen=True, slots=True)
class Exited:
    """How the command ended and what its log showed by then; ``before``: the unhealthy verdict it
    was killed for (its figures first, the exit's over them)."""

    returncode: int | None
    signal: int | None
    signal_name: str | None
    phase: str | None
    progress: BarAt | None = None
    blamed: Blamed | None = None
    last_lines: list[str] | None = None  # no failure probe matched: what the log said last
    before: Evidence | None = None
    kernel: str | None = None  # the kernel's report of an OOM kill
    limit: LimitFigures | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {} if self.before is None else self.before.to_json()
        data.update(returncode=self.returncode, signal=self.signal, signal_name=self.signal_name, phase=self.phase)
        if self.progress is not None:
            data["progress"] = self.progress.to_json()
        if self.blamed is not None:
            data.update(self.blamed.to_json())
        elif self.last_lines is not None:
            data["last_lines"] = self.last_lines
        if self.kernel is not None:
            data["kernel"] = self.kernel
        if self.limit is not None:
            data.update(self.limit.to_json())
        return data


@dataclass(frozen=True, slots=True)
class SchedulerEnded:
    """What a batch scheduler said ended the attempt."""

    scheduler_end: str
    returncode: int | None
    signal: int | None

    def to_json(self) -> dict[str, Any]:
        return {"scheduler_end": self.scheduler_end, "returncode": self.returncode, "signal": self.signal}


@dataclass(frozen=True, slots=True)
class Also:
    """The rule broken first, and the reasons of the others broken at the same look."""

    first: Evidence
    also: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {**self.first.to_json(), "also": list(self.also)}


@dataclass(frozen=True, slots=True)
class ExitNoted:
    """An exit's judgement with what the runner adds from the host and the reader: how long its
    ``cpu_max`` held it back, and how far its log was read when reading stopped moving."""

    judged: Evidence
    cpu_throttled_s: float | None = None
    log_read_to: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.judged.to_json()
        if self.cpu_throttled_s is not None:
            data["cpu_throttled_s"] = self.cpu_throttled_s
        if self.log_read_to is not None:
            data["log_read_to"] = self.log_read_to
        return data


def slow_step(evidence: Evidence) -> SlowStep:
    """The slow step a ``slow`` report's judgement carries."""
    return evidence if isinstance(evidence, SlowStep) else SlowStep.from_json(evidence.to_json())


Evidence = (NoEvidence | Healthy | Stalled | SlowStep | NoFirstProgress | PastDeadline | Silent | Unpinged
            | HungAfterFailure | EngineDead | StillWaiting | EngineHung | Idle | LossNotFinite | Diverged
            | PastMaxRuntime | Exited | SchedulerEnded | Also | ExitNoted)
