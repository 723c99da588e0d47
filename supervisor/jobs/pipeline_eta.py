"""A pipeline's overall ETA, from its steps' history: what is left of the running step (its
progress bar's ETA, else its usual duration less the time it has run) plus the usual duration of
each step still to come.  A step's usual duration is the median of its job's earlier attempts
that ended done; a step with none has no history, and then no ETA is given (and the note says which)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from supervisor.core import protocol
from supervisor.core.events import JobState

_TO_COME = (JobState.STARTING, JobState.WAITING, JobState.BACKOFF)


@dataclass(frozen=True, slots=True)
class PipelineEta:
    eta_s: float | None
    note: str  # why there is none ("ETA unknown: no history for step X"); "" when given or when nothing is left


def overall_eta(steps: Sequence[protocol.PipelineStepStatus], done_durations: Callable[[str], list[float]],
                now: float) -> PipelineEta:
    """``done_durations(job)``: how long each of the job's attempts that ended done ran, in seconds."""
    left = [s for s in steps if s.state is not JobState.DONE]
    if not left or any(s.state not in (JobState.RUNNING, *_TO_COME) for s in left):
        return PipelineEta(None, "")  # done, or a step gave up: nothing more will run by itself
    total = 0.0
    for step in left:
        usual = done_durations(step.job)
        median = statistics.median(usual) if usual else None
        attempt = step.attempt
        if step.state is JobState.RUNNING and attempt is not None and attempt.state.active:
            if attempt.progress is not None and attempt.progress.eta_s is not None:
                total += attempt.progress.eta_s
                continue
            if median is not None:
                total += max(0.0, median - (now - attempt.started))
                continue
        elif median is not None:
            total += median
            continue
        return PipelineEta(None, f"ETA unknown: no history for step {step.step}")
    return PipelineEta(total, "")
