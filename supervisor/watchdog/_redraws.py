"""A run of one bar's redraws, read together and taken as one summary.

A busy bar redraws a thousand times a second; each line of it moves the bar's count and
nothing else the watchdog reads.  The runner hands such lines over as ``Redraws``: the bar
(its probe and the fields that name it), the phase its lines name, its total and each line's
count, in order, all read at one time.  ``Facts.redrawn`` folds them in as the lines one by
one would, or refuses (and the runner feeds the lines one by one) when one of them could do
more than move the bar: a bar the latest progress line did not draw, a phase entered, a count
taken back.  ``inert`` says which lines' fields leave everything but the count alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.events import Phase


def inert(fields: Mapping[str, Any]) -> bool:
    """Whether a progress line with these fields changes nothing in the watchdog but its bar's count:
    it carries no loss (divergence), no serving engine's throughput (a hung engine) and no request
    answered (recovery after a failure)."""
    return "loss" not in fields and "gen_tps" not in fields and fields.get("serving") is not True


@dataclass(frozen=True, slots=True)
class Redraws:
    """Lines of one bar read together, none of them a failure, each with ``inert`` fields."""

    probe: str
    fields: Mapping[str, Any]  # the first line's: what names the bar (its description, its process)
    phase: Phase | None  # the phase the lines name (the probe's, else a ``phase`` field), the same for each
    total: int  # the same for each
    dones: tuple[int, ...]  # each line's count, whole steps, in order
