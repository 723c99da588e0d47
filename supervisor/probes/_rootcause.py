"""What a failure means beyond its own line, and which failure explains an attempt.

``FailureReader`` (used by the engine) completes each failure event:

- ``consequence``: set by the probe (``consequence = true``), or, for a traceback, when a
  consequence probe's regex matches its exception line (vLLM's API server raising
  ``RuntimeError: Engine core initialization failed. See root cause above.``).
- the phase the traceback's frames tell (``[[frames]]`` rules, innermost frame first): a
  crash inside ``init_process_group`` happened in ``distributed_init`` even when the log
  says nothing of it.
- ``config_error``: a value, key, assertion or not-implemented error classified before
  ``engine_ready`` (by the phases seen so far or the frames) is wrong settings or code.

``root_cause(failures)`` picks the attempt's failure: the first error line of the earliest
failing process, i.e. the first failure in log order (a traceback is placed at its first
line) that says what broke.  In order, the first tier that is not empty decides:

1. failures that are neither consequences, nor tracebacks cut off before their exception
   line, nor logged below ERROR: the first;
2. failures not logged below ERROR, 3. all of them: the first of a specific kind (a cut-off
   traceback whose header names an NCCL error rather than ``EngineCore failed to start.``),
   else the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import re2

from supervisor.core.events import Failure, FailureKind, Phase, ProbeEvent
from supervisor.probes._pack import Pack, re2_options
from supervisor.probes._traceback import TB_START

_STARTUP_KINDS = frozenset({FailureKind.VALUE_ERROR, FailureKind.KEY_ERROR, FailureKind.ASSERTION,
                            FailureKind.NOT_IMPLEMENTED})


class FailureReader:
    """The packs' consequence probes and frame rules, and the phase the log has reached."""

    def __init__(self, packs: Sequence[Pack]) -> None:
        self._consequences = _either([p.regex for pack in packs for p in pack.probes if p.consequence])
        self._fatal = _either([p.regex for pack in packs for p in pack.probes if p.fatal])
        self._frames = [(re2.compile(r.regex, re2_options(capture=False)), r.phase)
                        for pack in packs for r in pack.frames if r.phase is not None]
        # One search tells whether any rule knows a frame; most frames are library code none knows.
        self._any_frame = re2.compile("|".join(f"(?:{r.pattern})" for r, _ in self._frames),
                                      re2_options(capture=False)) if self._frames else None
        self.phase: Phase | None = None  # the furthest phase the log's lines have shown

    def saw(self, events: Iterable[ProbeEvent]) -> None:
        for event in events:
            if event.failure is None and event.phase is not None and (
                    self.phase is None or event.phase.rank > self.phase.rank):
                self.phase = event.phase

    def line_failure(self, failure: Failure, *, classified: bool, consequence: bool, fatal: bool = False) -> Failure:
        """A failure read from one line by a failure probe."""
        kind = self._startup_kind(failure.kind, None) if classified else failure.kind
        return replace(failure, kind=kind, consequence=consequence, fatal=fatal)

    def traceback_event(self, event: ProbeEvent, frames: Sequence[str]) -> ProbeEvent:
        """A traceback's failure event, with its consequence flag, kind and frame phase."""
        failure = event.failure
        assert failure is not None
        phase = self.frame_phase(frames)
        consequence = self._consequences is not None and self._consequences.search(failure.line) is not None
        fatal = self._fatal is not None and self._fatal.search(failure.line) is not None
        event.failure = replace(failure, kind=self._startup_kind(failure.kind, phase), consequence=consequence,
                                fatal=fatal)
        event.phase = phase
        return event

    def frame_phase(self, frames: Sequence[str]) -> Phase | None:
        """The phase the innermost frame that some rule knows tells."""
        if self._any_frame is None:
            return None
        for frame in reversed(frames):
            if self._any_frame.search(frame) is None:
                continue
            for regex, phase in self._frames:
                if regex.search(frame):
                    return phase
        return None

    def _startup_kind(self, kind: FailureKind, frame_phase: Phase | None) -> FailureKind:
        if kind not in _STARTUP_KINDS:
            return kind
        phases = [p for p in (self.phase, frame_phase) if p is not None]
        if not phases:
            return kind  # nothing says whether it started up: no guess
        reached = max(phases, key=lambda p: p.rank)
        return FailureKind.CONFIG_ERROR if reached.rank < Phase.ENGINE_READY.rank else kind


def cut_off(failure: Failure) -> bool:
    """A traceback whose exception line the log never showed (its line is the header)."""
    return failure.traceback is not None and TB_START in failure.line


def root_cause(failures: Sequence[Failure]) -> Failure | None:
    """The attempt's failure among failures in log order (module docstring)."""
    if not failures:
        return None
    telling = [f for f in failures if not (f.consequence or f.survivable or cut_off(f))]
    if telling:
        return telling[0]
    serious = [f for f in failures if not f.survivable]
    return _first_specific(serious or list(failures))


def echoes_only(failures: Sequence[Failure]) -> bool:
    """Whether these failures only echo one logged before them (consequences alone: torchrun's
    summary of a rank's crash).  Such a summary after the program seemed to go on (another rank's
    step, printed late, between the crash and the summary) explains nothing by itself: the failure
    it echoes, from before that step, is the root cause."""
    return bool(failures) and all(f.consequence for f in failures)


def _first_specific(failures: list[Failure]) -> Failure:
    return next((f for f in failures if f.kind is not FailureKind.OTHER), failures[0])


def _either(patterns: list[str]) -> Any:
    """One RE2 matching any of ``patterns`` (None for none)."""
    return re2.compile("|".join(f"(?:{p})" for p in patterns), re2_options(capture=False)) if patterns else None
