"""What the supervisor did when an attempt ended: relaunch it, give the job up, stop it at the
user's word, or nothing more (the job is done).

A stored attempt keeps the sentence (``attempts.action``, shown by ``attempts``, the API and the
report): ``relaunch in 4.0s``, ``give up: same failure twice ...``, ``stopped by user``,
``none: job done``; and its kind in a column of its own (``attempts.action_kind``), which readers
of the row act on.  Every version has begun the sentence with the kind's words, so the migration
that added the column read each older row's kind from them once (store/schema.py), and
``AttemptAction.read`` does the same for a sentence that comes without its row (an ``action``
event's message).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ActionKind(StrEnum):
    RELAUNCH = "relaunch"  # after the backoff wait
    GIVE_UP = "give_up"  # the job failed: no relaunch
    STOP = "stop"  # the user stopped it
    NONE = "none"  # nothing more to do (the job is done), or a sentence this version does not know


# Each kind's first words in the stored sentence, as every version has written them.
_LEAD: dict[ActionKind, str] = {
    ActionKind.RELAUNCH: "relaunch",
    ActionKind.GIVE_UP: "give up",
    ActionKind.STOP: "stopped by user",
    ActionKind.NONE: "none",
}


@dataclass(frozen=True, slots=True)
class AttemptAction:
    kind: ActionKind
    text: str  # the whole sentence, beginning with the kind's words

    @classmethod
    def relaunch(cls, wait_s: float) -> AttemptAction:
        return cls(ActionKind.RELAUNCH, f"{_LEAD[ActionKind.RELAUNCH]} in {wait_s:.1f}s")

    @classmethod
    def give_up(cls, reason: str) -> AttemptAction:
        return cls(ActionKind.GIVE_UP, f"{_LEAD[ActionKind.GIVE_UP]}: {reason}")

    @classmethod
    def stopped(cls) -> AttemptAction:
        return cls(ActionKind.STOP, _LEAD[ActionKind.STOP])

    @classmethod
    def none(cls, reason: str) -> AttemptAction:
        return cls(ActionKind.NONE, f"{_LEAD[ActionKind.NONE]}: {reason}")

    @classmethod
    def read(cls, text: str | None) -> AttemptAction | None:
        """A stored sentence's action (None: the attempt has not ended); a sentence that begins
        with no kind's words reads as ``none``."""
        if text is None:
            return None
        for kind, lead in _LEAD.items():
            if text.startswith(lead):
                return cls(kind, text)
        return cls(ActionKind.NONE, text)

    def __str__(self) -> str:
        return self.text
