"""Validated probe packs kept on disk between processes.

Validating the built-in packs (TOML, pydantic's models, every regex compiled and measured by
RE2) took 0.1 s, and importing pydantic 0.2-0.4 s more on a loaded machine, at every
``supervise probe``, ``doctor`` and daemon start.  A pack validated once is kept in one file,
``packs.cache`` beside the Hyperscan databases (``_hscache.cache_dir``), under a key that
digests what its validation read: the pack file's path (its ``source``) and bytes, and the
code that validates it (these modules' source, RE2's library).  A pack whose key is found
is rebuilt from plain JSON, without pydantic or a regex compile; one whose validation fails
is never kept, so its error is said again at every load.

Nothing here may change a pack or make loading fail: a file that is missing, cut short,
altered (its payload's digest is checked), of another format, or that holds a value of the
wrong type, and a folder that cannot be written, all mean "validate it", as without the
cache.  The folder is made private (0700) and the file written private (0600), whole or not
at all; it is opened without following a link and without waiting, under a size cap
(``_hscache.read_file``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import re2

from supervisor.core import events
from supervisor.core.events import FailureKind, Phase, ProbeKind
from supervisor.probes import _hscache, _limits, _pack, _syntax
from supervisor.probes._pack import Pack, Probe, Rule

_MAGIC = b"supervise-packs-1\n"
FILE_NAME = "packs.cache"
KEEP = 64  # packs kept: the built-in ones and a few versions of packs being written
_MAX_FILE_BYTES = 16 << 20
_DIGEST_CHARS = 64  # the payload's sha256, in hex, on the line after the magic


class _Malformed(Exception):
    """A kept value is not what a pack holds: the entry is not used."""


@functools.lru_cache(maxsize=1)
def _code_digest() -> bytes:
    """What validation depends on besides the pack file: the code that validates and RE2."""
    digest = hashlib.sha256(_MAGIC)
    for module in (_pack, _limits, _syntax, events):
        digest.update(Path(module.__file__ or "").read_bytes())
    with contextlib.suppress(OSError, AttributeError, TypeError):
        info = os.stat(re2._re2.__file__)  # program sizes (a limit) are RE2's own
        digest.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
    with contextlib.suppress(OSError):
        digest.update(Path(__file__).with_name("_packdef.py").read_bytes())
    return digest.digest()


def key(source: str, data: bytes) -> str:
    """The key of the pack read from ``source`` as ``data``, by this code."""
    digest = hashlib.sha256(_code_digest())
    digest.update(source.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(data)
    return digest.hexdigest()


class PackCache:
    """The kept packs of one process: read once, written back when a pack was added."""

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._entries: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return (self._folder or _hscache.cache_dir()) / FILE_NAME

    def get(self, name: str) -> Pack | None:
        entry = self._load().get(name)
        if entry is None:
            return None
        try:
            return _decode(entry)
        except (_Malformed, ValueError, TypeError, KeyError):
            return None

    def put(self, name: str, pack: Pack) -> None:
        """Keep ``pack`` as ``name`` (best effort: a write that fails is left undone)."""
        entries = self._load()
        entries.pop(name, None)
        entries[name] = _encode(pack)  # the last added last: the first to go are the oldest
        while len(entries) > KEEP:
            del entries[next(iter(entries))]
        payload = json.dumps(entries, separators=(",", ":")).encode()
        try:
            folder = self.path.parent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".packs-", suffix=".tmp")  # 0600
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except Exception:  # noqa: BLE001 - a cache that cannot be written costs a validation, nothing more
            return

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = _read(self.path)
        return self._entries


def _read(path: Path) -> dict[str, Any]:
    data = _hscache.read_file(path, _MAX_FILE_BYTES)
    head = len(_MAGIC) + _DIGEST_CHARS + 1
    if data is None or not data.startswith(_MAGIC) or len(data) < head:
        return {}
    payload = data[head:]
    if data[len(_MAGIC) : head - 1] != hashlib.sha256(payload).hexdigest().encode():
        return {}
    try:
        entries = json.loads(payload)
    except (ValueError, RecursionError):
        return {}
    return entries if isinstance(entries, dict) else {}


# ---- plain JSON of a pack ---------------------------------------------------------------


def _encode(pack: Pack) -> dict[str, Any]:
    return {
        "name": pack.name, "source": pack.source, "description": pack.description, "priority": pack.priority,
        "tracebacks": pack.tracebacks,
        "prefixes": [_rule(r) for r in pack.prefixes], "headers": [_rule(r) for r in pack.headers],
        "classify": [_rule(r) for r in pack.classify], "frames": [_rule(r) for r in pack.frames],
        "probes": [[p.pack, p.id, p.regex, p.kind.value, _value(p.phase), _value(p.failure), p.fields, p.constants,
                    list(p.groups), p.consequence, p.fatal] for p in pack.probes],
    }


def _value(member: Phase | FailureKind | None) -> str | None:
    return None if member is None else member.value


def _rule(rule: Rule) -> list[Any]:
    return [rule.pack, rule.id, rule.regex, _value(rule.failure), _value(rule.phase)]


def _decode(raw: Any) -> Pack:
    entry = _of(raw, dict)
    return Pack(
        name=_of(entry["name"], str), source=_of(entry["source"], str), description=_of(entry["description"], str),
        priority=_int(entry["priority"]), tracebacks=_of(entry["tracebacks"], bool),
        prefixes=_rules(entry["prefixes"]), headers=_rules(entry["headers"]), classify=_rules(entry["classify"]),
        frames=_rules(entry["frames"]), probes=tuple(_probe(p) for p in _of(entry["probes"], list)),
    )


def _rules(raw: Any) -> tuple[Rule, ...]:
    rules = []
    for item in _of(raw, list):
        pack, rule_id, regex, failure, phase = _of(item, list)
        rules.append(Rule(_of(pack, str), _of(rule_id, str), _of(regex, str),
                          None if failure is None else FailureKind(failure), None if phase is None else Phase(phase)))
    return tuple(rules)


def _probe(raw: Any) -> Probe:
    pack, probe_id, regex, kind, phase, failure, fields, constants, groups, consequence, fatal = _of(raw, list)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in _of(fields, dict).items()):
        raise _Malformed("fields")
    if not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in _of(constants, dict).items()):
        raise _Malformed("constants")
    if not all(isinstance(g, str) for g in _of(groups, list)):
        raise _Malformed("groups")
    return Probe(_of(pack, str), _of(probe_id, str), _of(regex, str), ProbeKind(kind),
                 None if phase is None else Phase(phase), None if failure is None else FailureKind(failure),
                 dict(fields), dict(constants), tuple(groups), _of(consequence, bool), _of(fatal, bool))


def _of(value: Any, kind: type[Any]) -> Any:
    if not isinstance(value, kind):
        raise _Malformed(kind.__name__)
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Malformed("int")
    return value
