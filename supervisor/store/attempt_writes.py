"""The typed writes of an attempt's row, one value each.

``AttemptUpdate`` is what a live attempt's row is told as it goes: its process once launched, how
far its log was read and what the reading found (phase, progress, failure), its exit status, what
it used.  A field left out keeps what is stored (``KEEP``); ``None`` stores NULL, so a field that
may be cleared says so.  ``AttemptEnd`` is how an attempt ended, as one value (pueue's ``Done``):
the state it ended in, the verdict, the action that follows, its exit status and when; only the
recorder stores one (``Recorder.attempt_ended``), with its event, in one transaction.  They are
values only: the store (database.py) alone maps them to the row's columns, so no caller names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from supervisor.core.actions import AttemptAction
from supervisor.core.events import AttemptState, Failure, Phase, Verdict
from supervisor.core.progress import BarProgress
from supervisor.core.usage import AttemptUsage


class _Keep(Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP  # a field not written: the row keeps what it holds
Kept = Literal[_Keep.KEEP]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptUpdate:
    """A write to a live attempt's row: only the fields given are stored."""

    pid: int | Kept | None = KEEP
    pgid: int | Kept | None = KEEP
    start_time: float | Kept | None = KEEP
    scheduler_id: str | Kept | None = KEEP
    log_offset: int | Kept = KEEP
    log_generation: int | Kept = KEEP
    phase: Phase | Kept | None = KEEP
    progress: BarProgress | Kept | None = KEEP
    failure: Failure | Kept | None = KEEP
    fingerprint: str | Kept | None = KEEP
    exit_code: int | Kept | None = KEEP
    exit_signal: int | Kept | None = KEEP
    usage: AttemptUsage | Kept | None = KEEP
    # A verdict while it runs (a warning before a kill), cleared when it moves again; an end's
    # verdict is the end's (``AttemptEnd``).
    verdict: Verdict | Kept | None = KEEP
    reason: str | Kept | None = KEEP


@dataclass(frozen=True, slots=True)
class ExitCode:
    """How the process ended: its code, or the signal that ended it (both None: not known)."""

    code: int | None
    signal: int | None


# The states an attempt ends in; LOST is not final: the daemon could not tell how it ended,
# and a later look (`supervise stop` finding its process alive) may still learn it.
FINAL_STATES = frozenset({AttemptState.ENDED, AttemptState.STOPPED})


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptEnd:
    """How an attempt ended, as one value.  ``exit``: its exit status, None where it is not known
    here (what is stored stays); ``at``: when it ended, None for now (the store stamps it)."""

    state: AttemptState
    reason: str
    action: AttemptAction | None = None
    verdict: Verdict | None = None
    exit: ExitCode | None = None
    at: float | None = None

    def __post_init__(self) -> None:
        if self.state.active:
            raise ValueError(f"an attempt does not end {self.state.value}: its end is ended, stopped or lost")
