"""How a payload is kept: its stored JSON and its lenient reading, derived from its dataclass fields.

A payload is a frozen dataclass that inherits ``StoredPayload`` and is declared with
``@carried_by(kind, ...)`` (or ``@carried_by()`` for one nested in another): the decorator reads
its fields' types once and generates its ``to_json``, ``from_json`` and ``of`` (as ``dataclasses``
generates ``__init__``; ``codec_source`` shows them), so no payload writes them by hand.  A field
whose type has no derived reading is refused where the class is declared, in one line that says
what to give it.

Writing: the fields in their order, each under its name; an enum as its value, nested payloads as
their JSON, a list, tuple or mapping as JSON can hold it (``jsonable``).

Reading is lenient, because the rows read may have been written by any earlier version: a missing
key reads as absent, a key the payload does not know is ignored, and a value of the wrong type or
an unknown enum value reads as absent too (``None``; a field that cannot be absent reads as its
type's zero: ``""``, ``0``, ``0.0``, ``()``), never as an error.  Data that is no mapping reads as
an empty one.

Where a field departs from that plain shape, a marker in ``Annotated`` says how:
``Omit.NONE``/``Omit.EMPTY`` (not written while None, or while empty), ``ShownWith(name)`` (written
only where field ``name`` is), ``Read(fn)`` (read by ``fn`` instead of by its type), ``Key(key)``
(stored under another key), ``Flagged(key)`` (a nested payload written among its parent's keys,
behind ``key: true``) and ``REST`` (a mapping of every key no other field reads).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Protocol, Self, TypeVar

from supervisor.core.events import EventKind


class Carries(Protocol):
    """Anything with an event's data: a stored ``Event``, the API's ``EventInfo``."""

    @property
    def data(self) -> Mapping[str, Any]: ...


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _plain(fields: dict[Any, Any]) -> bool:
    """Every key a string and every value a JSON scalar (a loop: no generator made per line)."""
    for key, value in fields.items():  # noqa: SIM110 - all() over a generator costs a frame per line
        if type(key) is not str or type(value) not in _PLAIN:
            return False
    return True


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples as lists, keys as strings, anything else as its text."""
    if type(value) is dict and _plain(value):
        return value  # a probe's fields, as they nearly always are: nothing to convert (one look per event)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# -- the markers -------------------------------------------------------------------------------


class Omit(enum.Enum):
    """When a field is left out of the stored JSON (only what its producer said is stored)."""

    NONE = "none"  # while it is None
    EMPTY = "empty"  # while it is empty or zero: None, "", 0, ()


@dataclass(frozen=True, slots=True)
class ShownWith:
    """Written only where the field named ``name`` is written (a dump's files, with its summary)."""

    name: str


@dataclass(frozen=True, slots=True)
class Read:
    """Read the stored value with ``fn`` instead of by the field's type (a count, which may be the
    text of a number; a command line, whose words are kept as text whatever they were)."""

    fn: Callable[[object], Any]


@dataclass(frozen=True, slots=True)
class Key:
    """Stored under ``key`` rather than under the field's name."""

    key: str


@dataclass(frozen=True, slots=True)
class Flagged:
    """A nested payload stored among its parent's keys, behind ``key: true`` (and read back only
    where that flag is ``true``)."""

    key: str


class _Rest:
    """The field is a mapping of every key no other field of the payload reads."""

    def __repr__(self) -> str:
        return "REST"


REST = _Rest()


# -- lenient readers of one stored value ----------------------------------------------------

_E = TypeVar("_E", bound=enum.Enum)


def number(value: object) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)


def integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def a_list(value: object) -> list[Any] | None:
    return list(value) if isinstance(value, list) else None


def texts(value: object) -> list[str]:
    """A list's items as text (a command line's words); not a list: none."""
    return [str(item) for item in a_list(value) or []]


def text_map(value: object) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def member(kind: type[_E], value: object) -> _E | None:
    """``value`` as a member of ``kind``; None for one this version does not know."""
    if not isinstance(value, str):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


_SCALARS: dict[type, tuple[Callable[[object], Any], object]] = {
    # a field's type: how its stored value is read, and what it reads as where it cannot be absent
    str: (text, ""),
    int: (integer, 0),
    float: (number, 0.0),
    bool: (flag, False),
}


# -- the codec ---------------------------------------------------------------------------------


class _Writes(enum.Enum):
    """How a field's value is written."""

    PLAIN = "plain"  # as it is
    MEMBER = "member"  # an enum: its value
    LIST = "list"  # a list or tuple of text, numbers or flags: a list of them
    JSON = "json"  # any other list, tuple or mapping: as JSON can hold it
    EACH = "each"  # a tuple of nested payloads: each one's JSON
    REST = "rest"  # a mapping whose keys are written among the payload's own
    FLAGGED = "flagged"  # a nested payload written among the payload's keys, behind its flag


@dataclass(frozen=True, slots=True)
class _Field:
    """One field's plan: the expression that reads it from the stored mapping (``get`` is the
    mapping's ``get``), and how and when it is written."""

    name: str
    key: str
    read: str
    writes: _Writes
    omit: Omit | None
    shown_with: str | None


def _is_stored(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, StoredPayload)


def _unwrap(hint: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """A field's type without its markers and None: (the type, its markers, whether it may be None)."""
    markers: tuple[Any, ...] = ()
    if typing.get_origin(hint) is Annotated:
        markers = tuple(hint.__metadata__)
        hint = hint.__origin__
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        kept = tuple(arg for arg in args if arg is not type(None))
        return (kept[0] if len(kept) == 1 else kept), markers, len(kept) < len(args)
    return hint, markers, False


def _reader(owner: type, name: str, hint: Any, optional: bool) -> tuple[Callable[[object], Any], object]:
    """How field ``name`` of ``owner``, of type ``hint``, reads one stored value, and what it reads as
    where that value is missing or wrong and the field cannot be absent (None: it can)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    one: Callable[[object], Any]
    zero: object = None
    if isinstance(hint, type) and hint in _SCALARS:
        one, zero = _SCALARS[hint]
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        one = functools.partial(member, hint)
    elif origin is list and optional:
        one = a_list  # as stored: the kill report's pairs, the quarantined GPUs
    elif origin is dict and args == (str, str):
        one = text_map
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis and (_is_stored(args[0]) or args[0] in _SCALARS):
        item = args[0]
        if _is_stored(item):
            one = lambda value: tuple(item.from_json(v) for v in a_list(value) or [] if isinstance(v, Mapping))  # noqa: E731
        else:
            one = lambda value: tuple(v for v in a_list(value) or [] if isinstance(v, item))  # noqa: E731
        zero = ()
    else:
        raise TypeError(f"{owner.__name__}.{name}: no lenient reading of {hint!r} is derived; give it Read(fn)")
    if optional:
        return one, None
    if zero is None:
        raise TypeError(f"{owner.__name__}.{name}: a {hint!r} may read as absent; declare it `| None`")
    return one, zero


def _writes(hint: Any) -> _Writes:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _Writes.MEMBER
    if origin is tuple and _is_stored(typing.get_args(hint)[0]):
        return _Writes.EACH
    if origin in (list, tuple) and typing.get_args(hint)[0] in _SCALARS:
        return _Writes.LIST
    if origin in (list, tuple, dict) or origin is Mapping:
        return _Writes.JSON
    return _Writes.PLAIN


class _Source:
    """The Python source of one payload's reader and writer, and the names it uses.  Generated once
    per class, as ``dataclasses`` generates ``__init__``: a payload is made and written for every
    event the supervisor records, and generated code costs what hand-written code did, where a
    loop over the fields with a call per field cost several times as much (tests/perf/bench_payloads.py)."""

    def __init__(self, cls: type) -> None:
        self.names: dict[str, Any] = {
            "_cls": cls,
            "_Mapping": Mapping,
            "_dict": dict,
            "_list": list,
            "_jsonable": jsonable,
        }

    def name(self, value: object) -> str:
        """A name in the generated code's globals that holds ``value``."""
        named = f"_v{len(self.names)}"
        self.names[named] = value
        return named


class _Codec:
    """A payload class's fields, read and written in their order, as generated functions."""

    def __init__(self, cls: type[StoredPayload]) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        source = _Source(cls)
        fields: list[_Field] = []
        own: set[str] = set()  # every key a field other than the rest reads
        for spec in dataclasses.fields(cls):  # type: ignore[arg-type]  # a payload is a dataclass
            hint, markers, optional = _unwrap(hints[spec.name])
            key = next((m.key for m in markers if isinstance(m, Key)), spec.name)
            omit = next((m for m in markers if isinstance(m, Omit)), cls.omit)
            shown_with = next((m.name for m in markers if isinstance(m, ShownWith)), None)
            flagged = next((m.key for m in markers if isinstance(m, Flagged)), None)
            custom = next((m.fn for m in markers if isinstance(m, Read)), None)
            if REST in markers:
                fields.append(_Field(spec.name, key, "", _Writes.REST, omit, shown_with))  # read: below
                continue
            if flagged is not None:
                if not (_is_stored(hint) and optional):
                    raise TypeError(f"{cls.__name__}.{spec.name}: Flagged(...) marks an optional payload")
                nested = source.name(hint)
                read = f"({nested}.from_json(data) if get({flagged!r}) is True else None)"
                fields.append(_Field(spec.name, flagged, read, _Writes.FLAGGED, Omit.NONE, shown_with))
                own.update(hint.keys, {flagged})
                continue
            one, zero = (custom, None) if custom is not None else _reader(cls, spec.name, hint, optional)
            read = f"{source.name(one)}(get({key!r}))"
            if zero is not None:
                read = f"({read} or {source.name(zero)})"
            fields.append(_Field(spec.name, key, read, _writes(hint), omit, shown_with))
            own.add(key)
        known = source.name(frozenset(own))
        fields = [
            dataclasses.replace(f, read=f"{{k: v for k, v in data.items() if k not in {known}}}")
            if f.writes is _Writes.REST
            else f
            for f in fields
        ]
        self.keys = frozenset(own)
        self.source = _reading(fields) + _writing(fields)
        exec(self.source, source.names)  # the source is made above from the class's own fields and markers
        self.read: Callable[[object], Any] = source.names["read"]
        self.of: Callable[[Carries], Any] = source.names["of"]
        self.write: Callable[[StoredPayload], dict[str, Any]] = source.names["write"]


def _reading(fields: list[_Field]) -> str:
    made = ", ".join(f.read for f in fields)
    body = (
        "    if type(data) is not _dict and not isinstance(data, _Mapping):\n"
        "        data = {}\n"
        "    get = data.get\n"
        f"    return _cls({made})\n"
    )
    return f"def read(data):\n{body}\ndef of(event):\n    data = event.data\n{body}\n"


def _value(f: _Field, v: str) -> str:
    """The expression that writes field ``f``'s value, which expression ``v`` holds."""
    if f.writes is _Writes.MEMBER:
        return f"(None if {v} is None else {v}.value)"
    if f.writes is _Writes.LIST:
        return f"(None if {v} is None else _list({v}))"
    if f.writes is _Writes.JSON:
        return f"_jsonable({v})"
    if f.writes is _Writes.EACH:
        return f"[item.to_json() for item in {v}]"
    return v


def _writing(fields: list[_Field]) -> str:
    if all(f.omit is None and f.shown_with is None and f.writes not in (_Writes.REST, _Writes.FLAGGED) for f in fields):
        # every field always written: one dict display, as a hand-written to_json would be
        made = ", ".join(f"{f.key!r}: {_value(f, f'self.{f.name}')}" for f in fields)
        return f"def write(self):\n    return {{{made}}}\n"
    by_name = {f.name: f for f in fields}
    lines = ["def write(self):", "    out = {}"]
    for f in fields:
        conditions = [_shown(f.omit, "v")]
        if f.shown_with is not None:
            conditions.append(_shown(by_name[f.shown_with].omit, f"self.{f.shown_with}"))
        test = " and ".join(c for c in conditions if c)
        if f.writes is _Writes.REST:
            put = ["out.update(_jsonable(_dict(v)))"]
        elif f.writes is _Writes.FLAGGED:
            put = [f"out[{f.key!r}] = True", "out.update(v.to_json())"]
        else:
            put = [f"out[{f.key!r}] = {_value(f, 'v')}"]
        lines.append(f"    v = self.{f.name}")
        if test:
            lines.append(f"    if {test}:")
            lines += [f"        {line}" for line in put]
        else:
            lines += [f"    {line}" for line in put]
    return "\n".join([*lines, "    return out", ""])


def _shown(omit: Omit | None, value: str) -> str:
    """The condition under which a field of this omission whose value is ``value`` is written."""
    if omit is Omit.NONE:
        return f"{value} is not None"
    if omit is Omit.EMPTY:
        return value
    return ""


# -- the base class and the registry -------------------------------------------------------------


class StoredPayload:
    """A payload kept as JSON: made by its producer, stored by ``to_json()``, read back by
    ``of(event)`` or ``from_json(data)``, all three derived from its fields by ``@carried_by``
    (which puts its generated functions in place of these)."""

    __slots__ = ()

    omit: ClassVar[Omit | None] = None  # every field's omission, where its own markers name none
    keys: ClassVar[frozenset[str]] = frozenset()  # the keys it reads
    codec_source: ClassVar[str] = ""  # the generated source of its reader and writer, to read

    @classmethod
    def of(cls, event: Carries) -> Self:
        """The payload of ``event`` (a stored event, or the API's)."""
        raise TypeError(f"{cls.__name__} has no codec: declare it with @carried_by")

    @classmethod
    def from_json(cls, data: object) -> Self:
        raise TypeError(f"{cls.__name__} has no codec: declare it with @carried_by")

    def to_json(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} has no codec: declare it with @carried_by")


_P = TypeVar("_P", bound=StoredPayload)

# Which payload each kind's events carry: filled by @carried_by (and by ``register`` for a
# payload that is no dataclass); read by ``payloads.payload_of``.
REGISTRY: dict[EventKind, type[Any]] = {}


def register(payload: type[Any], *kinds: EventKind) -> None:
    for kind in kinds:
        if kind in REGISTRY:
            raise TypeError(f"{kind.value} events already carry {REGISTRY[kind].__name__}")
        REGISTRY[kind] = payload


def carried_by(*kinds: EventKind) -> Callable[[type[_P]], type[_P]]:
    """Derive the payload's codec from its fields, and register it as what ``kinds``' events carry
    (no kinds: a payload nested in another)."""

    def derive(cls: type[_P]) -> type[_P]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__}: a payload is a dataclass (put @carried_by above @dataclass)")
        codec = _Codec(cls)
        cls.keys, cls.codec_source = codec.keys, codec.source
        setattr(cls, "from_json", staticmethod(codec.read))  # noqa: B010 - over the base's, which mypy reads
        setattr(cls, "of", staticmethod(codec.of))  # noqa: B010
        setattr(cls, "to_json", codec.write)  # noqa: B010
        register(cls, *kinds)
        return cls

    return derive
