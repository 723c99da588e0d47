"""A progress bar's count, read one way everywhere: from a probe's fields (``Progress``: the
probe engine's events, the watchdog's tracks, the stored milestones, the alerts, the report),
and where an attempt's most recently moved bar stands (``BarProgress``: a runner's snapshot,
the attempt's row, ``status`` and the metrics).

Reading is lenient, as rows written by any earlier version are read with it: a count is a
number or the text of one (a capture without a field type), anything else is none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


def count(value: object) -> int | float | None:
    """A count as a probe captured it: a number, or the text of one (a capture without a field
    type); an int stays an int, so that ``5/10`` never reads ``5.0/10.0``.  NaN is no count; an
    infinite one is kept as captured (see ``Progress.finite``)."""
    if type(value) is int:  # the common case first: read for every progress line
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            value = float(text)
        except ValueError:
            return None
    if isinstance(value, float):
        return None if math.isnan(value) else value
    return None


# Progress(...) made by tuple.__new__ directly, skipping the named tuple's Python-level __new__.
_new = tuple.__new__
_INF, _floor = math.inf, math.floor


def _number(value: object) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class Progress(NamedTuple):
    """One progress line's count, read from a probe's fields (``done`` and usually ``total``).

    A named tuple rather than a frozen dataclass, as ``Record`` is: one is read for every
    progress line, by the watchdog and by the store's milestones, and a frozen dataclass costs
    several times as much to make."""

    done: int | float
    total: int | float | None = None
    unit: str | None = None  # a probe's constant ``set = { unit = ... }``
    rate: float | None = None  # items per second, when the line prints one
    desc: str | None = None  # the bar's own description, when the probe captures one

    @classmethod
    def read(cls, fields: Mapping[str, Any]) -> Progress | None:
        """The count of a line, or None when it has none this reading can use."""
        # Inlined (no helper calls on the common path): read for every progress line.
        get = fields.get
        done = get("done")
        if type(done) is not int:
            done = count(done)
            if done is None:
                return None
        total = get("total")
        if total is not None and type(total) is not int:
            total = count(total)
        unit, rate, desc = get("unit"), get("rate"), get("desc")
        return _new(cls, (done, total, unit if type(unit) is str else None,
                          float(rate) if type(rate) is float or type(rate) is int else None,
                          None if desc is None else str(desc)))

    @property
    def finite(self) -> bool:
        """The count is a finite number: one the stored milestones can place on a bar."""
        return math.isfinite(self.done)

    @property
    def fraction(self) -> float | None:
        """done / total, for a bar with a positive total."""
        return None if self.total is None or self.total <= 0 else self.done / self.total

    @property
    def percent(self) -> int | None:
        """The whole percent reached (capped at 100), for a bar with a positive finite total."""
        total = self.total
        if total is None or not 0 < total < _INF:
            return None
        done = self.done
        return _floor(100 * (done if done < total else total) / total)

    def to_json(self) -> dict[str, Any]:
        values = {"done": self.done, "total": self.total, "unit": self.unit, "rate": self.rate, "desc": self.desc}
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True)
class BarProgress:
    """Where an attempt's most recently moved bar stands, as the watchdog tracks it: what a
    runner's snapshot shows, and what the attempt's row keeps (``status``, ``attempts``, the
    metrics).  ``rate_s_per_it`` is the bar's median seconds per item."""

    probe: str
    done: float
    total: float | None
    rate_s_per_it: float | None
    eta_s: float | None
    bar: str | None = None  # its label (description, process) when one probe draws several bars

    @classmethod
    def from_json(cls, data: object) -> BarProgress | None:
        """A stored row's progress; None when it has none this reading can use."""
        if not isinstance(data, Mapping):
            return None
        probe, done = _text(data.get("probe")), count(data.get("done"))
        if probe is None or done is None:
            return None
        return cls(probe, done, count(data.get("total")), _number(data.get("rate_s_per_it")),
                   _number(data.get("eta_s")), _text(data.get("bar")))

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "bar": self.bar, "done": self.done, "total": self.total,
                "rate_s_per_it": self.rate_s_per_it, "eta_s": self.eta_s}
