"""reference/spec.md: every field of a job spec, from the pydantic models (supervisor/spec*.py), with
its type, default and range, and the comment the source keeps beside it."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from supervisor.spec.tables import MAX_SECONDS, off_to_none

from .source import cell, doc, member_comments

# Filled by supervise itself, never read from a file.
NOT_FROM_THE_FILE = {"spec_path", "shard_index"}
# Where an enum's values are listed.
_ENUM_PAGES = {"Phase": "events.md#phases", "Verdict": "events.md#verdicts"}


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for item in metadata:
        for kind, attr, sign in ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<")):
            if isinstance(item, kind):
                value = getattr(item, attr)
                if value == MAX_SECONDS:
                    parts.append(f"{sign} 366 days")
                    continue
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value:,}")
        if isinstance(item, MinLen):
            parts.append(f"at least {item.min_length} item{'s' if item.min_length != 1 else ''}")
        if isinstance(item, MaxLen):
            parts.append(f"at most {item.max_length:,}")
        if isinstance(item, FieldInfo):
            parts.append(_bounds(item.metadata))
    return ", ".join(p for p in parts if p)


def type_name(annotation: Any) -> str:
    """A reader's name for a type: `list of phase`, `kill | warn`, `float (≥ 0, ≤ 3.16e+07)`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        if any(getattr(m, "func", None) is off_to_none for m in args[1:]):
            return f'{type_name(args[0])} or `"off"`'  # written "off" in a spec, None in the model
        bounds = _bounds(list(args[1:]))
        return f"{type_name(args[0])} ({bounds})" if bounds else type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        # TOML has no null: an optional field is left out (its default says "unset"), never written none.
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"table: {type_name(args[0])} → {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        page = _ENUM_PAGES.get(annotation.__name__)
        name = annotation.__name__.lower()
        return f"[{name}](events.md#{name}s)" if page is None else f"[{name}]({page})"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def default_of(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        value = [v.value if isinstance(v, enum.Enum) else v for v in value]
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def field_rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    notes = member_comments(model)
    rows = []
    for name, info in model.model_fields.items():
        if name in NOT_FROM_THE_FILE:
            continue
        annotation = info.annotation
        if info.metadata:
            annotation = typing.Annotated[annotation, *info.metadata]  # the field's own bounds
        rows.append(f"| `{prefix}{name}` | {type_name(annotation)} | {default_of(info)} | {cell(notes.get(name, ''))} |")
    return rows


def render() -> str:
    from supervisor.spec.model import JobSpec

    out = ["# Job spec", "",
           "Generated from the pydantic models (`supervisor/spec/model.py`, `supervisor/spec/tables.py`) by",
           "`python docs/gen_reference.py`; do not edit by hand. The notes are the comments beside each field in",
           "the source. Unknown fields are refused (one line naming the file and the field, exit 65). Durations",
           "are seconds, finite, at most 366 days. How to write a spec: [the guide](../guides/job-specs.md).", "",
           "## Top level", "",
           "| field | type | default | notes |", "|---|---|---|---|"]
    tables = []
    for name, info in JobSpec.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            tables.append((name, annotation))
    out += field_rows(JobSpec)
    for name, model in tables:
        out += ["", f"## `[{name}]`", "", doc(model), "", "| field | type | default | notes |", "|---|---|---|---|"]
        out += field_rows(model, f"{name}.")
    return "\n".join(out).rstrip() + "\n"
