"""`[restart.adjust]`: parameters changed at a relaunch after a given verdict.

    [restart.adjust]
    oom = { batch_size = "x0.5", min = "8" }      # each OOM halves batch_size, never below 8
    stalled = { num_workers = "-2", min = 0 }

A change is `"x0.5"` (multiply; `"*0.5"` too), `"+4"` / `"-4"` (add, subtract) or `"32"` (set);
`min` and `max` bound every parameter of the rule.  Changes are cumulative: each relaunch starts
from the parameters the failed attempt ran with.  A parameter whose value is an integer stays one
(a product is rounded down), so `--batch-size 32` never becomes `--batch-size 32.0`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_serializer, model_validator

from supervisor.core.errors import shown

_BOUNDS = ("min", "max")
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_CHANGE_RE = re.compile(rf"(?P<op>[x*+-]?)(?P<num>{_NUMBER})")
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(rf"[+-]?{_NUMBER}")
_HOW = 'write "x0.5" (multiply), "+4" or "-4" (add, subtract) or "32" (set)'


@dataclass(frozen=True)
class Change:
    """One parameter's change: ``op`` one of "x", "+", "-", "=" and its operand as written."""

    op: str
    operand: str

    @classmethod
    def parse(cls, text: str) -> Change:
        match = _CHANGE_RE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"{shown(text)}: {_HOW}")
        op = {"": "=", "*": "x"}.get(match["op"], match["op"])
        if op == "x" and float(match["num"]) <= 0:
            raise ValueError(f"{shown(text)}: multiply by a number above 0")
        return cls(op, match["num"])

    def __str__(self) -> str:
        return self.operand if self.op == "=" else f"{self.op}{self.operand}"


def _number(value: object, what: str) -> float:
    text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if text is None or not _FLOAT_RE.fullmatch(text) or not math.isfinite(float(text)):
        raise ValueError(f"{what} must be a number; got {shown(str(value))}")
    return float(text)


class AdjustRule(BaseModel):
    """The changes made to ``[params]`` at a relaunch after one verdict, written flat in the spec
    (`{ batch_size = "x0.5", min = "8" }`): every key but `min` and `max` is a parameter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    changes: dict[str, str]
    min: float | None = None
    max: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError('a table such as { batch_size = "x0.5", min = "8" }')
        changes = {str(k): v for k, v in value.items() if k not in _BOUNDS}
        for name, change in changes.items():
            if not isinstance(change, (str, int, float)) or isinstance(change, bool):
                raise ValueError(f"{shown(name)}: {_HOW}")
        if not changes:
            raise ValueError('names no parameter to change: add one, as in { batch_size = "x0.5" }')
        return {"changes": {k: str(v) for k, v in changes.items()},
                **{b: _number(value[b], b) for b in _BOUNDS if b in value}}

    @field_validator("changes")
    @classmethod
    def _valid_changes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            try:
                Change.parse(text)
            except ValueError as exc:
                raise ValueError(f"{shown(name)}: {exc}") from None
        return {name: text.strip() for name, text in value.items()}

    @model_validator(mode="after")
    def _bounds_in_order(self) -> AdjustRule:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self

    @model_serializer(mode="plain")
    def _to_flat(self) -> dict[str, Any]:
        # Written back as the spec wrote it, so that a stored spec reads back the same.
        bounds = {b: getattr(self, b) for b in _BOUNDS if getattr(self, b) is not None}
        return {**self.changes, **bounds}

    def check_against(self, params: dict[str, str]) -> None:
        """ValueError unless each parameter it changes is in ``params`` with a value it can change."""
        for name, text in self.changes.items():
            if name not in params:
                known = ", ".join(sorted(params)) or "none"
                raise ValueError(f"{shown(name)} is not in [params] (known: {known}); add it there")
            self.apply_one(name, params[name], Change.parse(text))

    def apply(self, params: dict[str, str]) -> dict[str, str]:
        """``params`` with this rule's changes made (those it does not name as they were)."""
        out = dict(params)
        for name, text in self.changes.items():
            if name in out:
                out[name] = self.apply_one(name, out[name], Change.parse(text))
        return out

    def apply_one(self, name: str, value: str, change: Change) -> str:
        base = _number(value, f"[params] {name}")
        integral = bool(_INT_RE.fullmatch(value.strip()))
        operand = float(change.operand)
        if integral and change.op != "x" and not operand.is_integer():
            raise ValueError(f"{name}: {change} would make the integer {value} a fraction; use a whole number")
        result = {"x": base * operand, "+": base + operand, "-": base - operand, "=": operand}[change.op]
        if self.min is not None:
            result = max(result, math.ceil(self.min) if integral else self.min)
        if self.max is not None:
            result = min(result, math.floor(self.max) if integral else self.max)
        if integral:
            return str(math.floor(result))
        return repr(float(result))


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``name=new (was old)`` for each parameter that differs, sorted by name."""
    return [f"{k}={after[k]} (was {before.get(k, '')})" for k in sorted(after) if after[k] != before.get(k)]
