"""How a payload is kept: its stored JSON and its lenient reading, derived from its dataclass fields.

A payload is a frozen dataclass that inherits ``StoredPayload`` and is declared with
``@carried_by(kind, ...)`` (or ``@carried_by()`` for one nested in another): the decorator reads
its fields' types once and builds its codec, so no payload writes ``to_json``/``from_json`` by hand.

Writing: the fields in their order, each under its name; an enum as its value, a nested payload as
its JSON, a list, tuple or mapping as JSON can hold it (``jsonable``).

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


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples as lists, keys as strings, anything else as its text."""
    if type(value) is dict and all(type(k) is str and type(v) in _PLAIN for k, v in value.items()):
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


@dataclass(frozen=True, slots=True)
class _Field:
    """One field's plan: how it is read from the whole stored mapping, and how it is written
    (``write`` None: the value as it is, the common case, with no call)."""

    name: str
    key: str
    read: Callable[[Mapping[str, Any]], Any]
    write: Callable[[dict[str, Any], str, Any], None] | None
    omit: Omit | None
    shown_with: str | None


def _put_json(out: dict[str, Any], key: str, value: Any) -> None:
    out[key] = jsonable(value)


def _put_member(out: dict[str, Any], key: str, value: enum.Enum | None) -> None:
    out[key] = None if value is None else value.value


def _put_nested_each(out: dict[str, Any], key: str, value: tuple[StoredPayload, ...]) -> None:
    out[key] = [item.to_json() for item in value]


def _put_rest(out: dict[str, Any], _key: str, value: Mapping[str, Any]) -> None:
    out.update(jsonable(dict(value)))


def _flagged_put(flag_key: str) -> Callable[[dict[str, Any], str, Any], None]:
    def put(out: dict[str, Any], _key: str, value: StoredPayload) -> None:
        out[flag_key] = True
        out.update(value.to_json())

    return put


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


def _reader(owner: type, name: str, hint: Any, optional: bool, key: str) -> Callable[[Mapping[str, Any]], Any]:
    """How field ``name`` of ``owner``, of type ``hint``, is read from the whole stored mapping."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    one: Callable[[object], Any]
    zero: object = None  # what a field that cannot be absent reads as where its value is missing or wrong
    if isinstance(hint, type) and hint in _SCALARS:
        one, zero = _SCALARS[hint]
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        kind = hint
        one = lambda value: member(kind, value)  # noqa: E731 - one reader per enum field
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
        return lambda data: one(data.get(key))
    if zero is None:
        raise TypeError(f"{owner.__name__}.{name}: a {hint!r} may read as absent; declare it `| None`")
    return lambda data: one(data.get(key)) or zero


def _writer(hint: Any) -> Callable[[dict[str, Any], str, Any], None] | None:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _put_member
    if origin is tuple and _is_stored(typing.get_args(hint)[0]):
        return _put_nested_each
    if origin in (list, tuple, dict) or origin is Mapping:
        return _put_json
    return None


_OMIT_CODE = {None: 0, Omit.NONE: 1, Omit.EMPTY: 2}


class _Codec:
    """A payload class's fields, read and written in their order."""

    __slots__ = ("_cls", "_plan", "_reads", "keys")

    def __init__(self, cls: type[StoredPayload]) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields: list[_Field] = []
        rest: str | None = None
        for spec in dataclasses.fields(cls):  # type: ignore[arg-type]  # a payload is a dataclass
            hint, markers, optional = _unwrap(hints[spec.name])
            key = next((m.key for m in markers if isinstance(m, Key)), spec.name)
            omit = next((m for m in markers if isinstance(m, Omit)), cls.omit)
            shown_with = next((m.name for m in markers if isinstance(m, ShownWith)), None)
            flagged = next((m.key for m in markers if isinstance(m, Flagged)), None)
            custom = next((m.fn for m in markers if isinstance(m, Read)), None)
            if REST in markers:
                rest = spec.name  # its reading is made below, once every other key is known
                fields.append(_Field(spec.name, key, dict, _put_rest, omit, shown_with))
            elif flagged is not None:
                if not (_is_stored(hint) and optional):
                    raise TypeError(f"{cls.__name__}.{spec.name}: Flagged(...) marks an optional payload")
                fields.append(
                    _Field(
                        spec.name, flagged, _flagged_read(flagged, hint), _flagged_put(flagged), Omit.NONE, shown_with
                    )
                )
            elif custom is not None:
                fields.append(_Field(spec.name, key, _custom_read(custom, key), _writer(hint), omit, shown_with))
            else:
                fields.append(
                    _Field(
                        spec.name, key, _reader(cls, spec.name, hint, optional, key), _writer(hint), omit, shown_with
                    )
                )
        self.keys = frozenset(f.key for f in fields)
        if rest is not None:
            known = self.keys - {rest}
            fields = [dataclasses.replace(f, read=_rest_read(known)) if f.name == rest else f for f in fields]
        by_name = {f.name: f for f in fields}
        self._cls = cls
        self._reads = tuple(f.read for f in fields)
        self._plan = tuple(
            (
                f.name,
                f.key,
                f.write,
                _OMIT_CODE[f.omit],
                f.shown_with,
                _OMIT_CODE[by_name[f.shown_with].omit] if f.shown_with is not None else 0,
            )
            for f in fields
        )

    def read(self, data: object) -> Any:
        found: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        return self._cls(*[read(found) for read in self._reads])

    def write(self, payload: StoredPayload) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, key, put, omit, gate, gate_omit in self._plan:
            value = getattr(payload, name)
            if omit and (value is None if omit == 1 else not value):
                continue
            if gate is not None and gate_omit:
                shown = getattr(payload, gate)
                if shown is None if gate_omit == 1 else not shown:
                    continue
            if put is None:
                out[key] = value
            else:
                put(out, key, value)
        return out


def _custom_read(fn: Callable[[object], Any], key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda data: fn(data.get(key))


def _flagged_read(flag_key: str, nested: type[StoredPayload]) -> Callable[[Mapping[str, Any]], Any]:
    return lambda data: nested.from_json(data) if data.get(flag_key) is True else None


def _rest_read(known: frozenset[str]) -> Callable[[Mapping[str, Any]], Any]:
    return lambda data: {k: v for k, v in data.items() if k not in known}


# -- the base class and the registry -------------------------------------------------------------


class StoredPayload:
    """A payload kept as JSON: made by its producer, stored by ``to_json()``, read back by
    ``of(event)`` or ``from_json(data)``, all derived from its fields by ``@carried_by``."""

    __slots__ = ()

    omit: ClassVar[Omit | None] = None  # every field's omission, where its own markers name none
    _codec: ClassVar[_Codec]

    @classmethod
    def codec(cls) -> _Codec:
        return cls._codec

    @classmethod
    def of(cls, event: Carries) -> Self:
        """The payload of ``event`` (a stored event, or the API's)."""
        payload: Self = cls._codec.read(event.data)
        return payload

    @classmethod
    def from_json(cls, data: object) -> Self:
        payload: Self = cls._codec.read(data)
        return payload

    def to_json(self) -> dict[str, Any]:
        return self._codec.write(self)


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
        cls._codec = _Codec(cls)
        register(cls, *kinds)
        return cls

    return derive
