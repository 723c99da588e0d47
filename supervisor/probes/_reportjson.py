"""The offline report's JSON, byte for byte as pydantic's ``model_dump_json(indent=2)`` wrote it
when the report was a set of pydantic models: the golden snapshots and users' scripts read those
bytes.  Written here by hand so that ``supervise probe`` imports no pydantic (a third of its
start-up); ``tests/test_probes_replay.py`` compares it with pydantic's on every event of the corpus
and on values chosen to differ (floats in exponent form, control characters, non-finite numbers).

What differs from ``json.dumps``: a float under 1e-4 in exponent form has no zero-padded exponent
(``1e-7``, not ``1e-07``) and one of 1e-5 to 1e-4 is written out (``0.00001234``); a non-finite
float is ``null``.  Strings are escaped as both escape them (quote, backslash, control characters;
nothing else, non-ASCII kept as it is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import Enum
from json.encoder import encode_basestring  # the C escaper, without ensure_ascii's \\u escapes

INDENT = "  "  # what pydantic indents each level by, with indent=2


def dumps(value: object, level: int = 0) -> str:
    """``value`` (None, bool, int, float, str, an Enum of those, a list, a mapping with str keys) as
    pydantic writes it with ``indent=2``, its nested lines indented from ``level``."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):  # a StrEnum included: its value
        return encode_basestring(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return number(value)
    if isinstance(value, Enum):
        return dumps(value.value, level)
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        inner = INDENT * (level + 1)
        items = (f"{inner}{encode_basestring(key)}: {dumps(item, level + 1)}" for key, item in value.items())
        return "{\n" + ",\n".join(items) + "\n" + INDENT * level + "}"
    if isinstance(value, Sequence):
        if not value:
            return "[]"
        inner = INDENT * (level + 1)
        return "[\n" + ",\n".join(inner + dumps(item, level + 1) for item in value) + "\n" + INDENT * level + "]"
    raise TypeError(f"no JSON form for {type(value).__name__}")


def mapping(value: Mapping[str, object], level: int) -> str:
    """``dumps`` of a mapping, its str, int and float values written without the walk: a listed
    event's fields, written once per event (the walk was 7% of `supervise probe` on a busy log)."""
    if not value:
        return "{}"
    inner = ",\n" + INDENT * (level + 1)
    parts = []
    for key, item in value.items():
        kind = type(item)  # exactly these types (a bool is an int to isinstance); mypy cannot narrow by it
        if kind is str:
            text = encode_basestring(item)  # type: ignore[arg-type]
        elif kind is int:
            text = int.__repr__(item)
        elif kind is float:
            text = number(item)  # type: ignore[arg-type]
        else:
            text = dumps(item, level + 1)
        parts.append(f"{encode_basestring(key)}: {text}")
    return "{" + inner[1:] + inner.join(parts) + "\n" + INDENT * level + "}"


def number(value: float) -> str:
    """A float as pydantic writes it (see the module's docstring)."""
    if not math.isfinite(value):
        return "null"
    text = float.__repr__(value)
    if "e-" not in text:  # the same shortest digits; only small exponents are written otherwise
        return text
    mantissa, _, exponent = text.partition("e")
    power = int(exponent)
    if power < -5:
        return f"{mantissa}e{power}"
    sign = "-" if mantissa.startswith("-") else ""
    return f"{sign}0.{'0' * (-power - 1)}{mantissa.lstrip('-').replace('.', '')}"


def string(value: str | None) -> str:
    """A str, an StrEnum or None."""
    return "null" if value is None else encode_basestring(value)
