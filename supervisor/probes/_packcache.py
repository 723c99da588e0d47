"""Validated probe packs kept on disk between processes.

Validating the built-in packs (TOML, pydantic's models, every regex compiled and measured by
RE2) took 0.05 s of CPU, and importing pydantic for it more, at every ``supervise probe``,
``doctor`` and daemon start (RESULTS §39).  A pack validated once is kept in one file,
``packs.cache`` beside the Hyperscan databases (``_hscache.cache_dir``), under a key that
digests what its validation read: the pack file's path (its ``source``) and bytes; the file is
read back only by the code that wrote it (``_kept.code_digest``).  A pack whose key is found
is rebuilt from plain JSON, without pydantic or a regex compile; one whose validation fails
is never kept, so its error is said again at every load.

Nothing here may change a pack or make loading fail: a file that is missing, cut short,
altered (its payload's digest is checked), of another format, or that holds a value of the
wrong type, and a folder that cannot be written, all mean "validate it", as without the
cache.  The folder is made private (0700) and the file written private (0600), whole or not
at all; it is opened without following a link and without waiting, under a size cap
(``_kept.KeptFile``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from supervisor.core.events import FailureKind, Phase, ProbeKind
from supervisor.probes._kept import KeptFile, Malformed, of
from supervisor.probes._pack import Pack, Probe, Rule

FILE_NAME = "packs.cache"
KEEP = 64  # packs kept: the built-in ones and a few versions of packs being written


def key(source: str, data: bytes) -> str:
    """The key of the pack read from ``source`` as ``data``."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass") + b"\0" + data).hexdigest()


class PackCache:
    """The kept packs of one process: read once, written back when a pack was added."""

    def __init__(self, folder: Path | None = None) -> None:
        self._file = KeptFile(FILE_NAME, b"supervise-packs-1\n", KEEP, folder)

    @property
    def path(self) -> Path:
        return self._file.path

    def get(self, name: str) -> Pack | None:
        entry = self._file.get(name)
        if entry is None:
            return None
        try:
            return _decode(entry)
        except (Malformed, ValueError, TypeError, KeyError):
            return None

    def put(self, name: str, pack: Pack) -> None:
        """Keep ``pack`` as ``name`` (written by ``save``)."""
        self._file.put(name, _encode(pack))

    def save(self) -> None:
        """Write the packs put since the last save, in one write (best effort)."""
        self._file.save()


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
    entry = of(raw, dict)
    return Pack(
        name=of(entry["name"], str), source=of(entry["source"], str), description=of(entry["description"], str),
        priority=_int(entry["priority"]), tracebacks=of(entry["tracebacks"], bool),
        prefixes=_rules(entry["prefixes"]), headers=_rules(entry["headers"]), classify=_rules(entry["classify"]),
        frames=_rules(entry["frames"]), probes=tuple(_probe(p) for p in of(entry["probes"], list)),
    )


def _rules(raw: Any) -> tuple[Rule, ...]:
    rules = []
    for item in of(raw, list):
        pack, rule_id, regex, failure, phase = of(item, list)
        rules.append(Rule(of(pack, str), of(rule_id, str), of(regex, str),
                          None if failure is None else FailureKind(failure), None if phase is None else Phase(phase)))
    return tuple(rules)


def _probe(raw: Any) -> Probe:
    pack, probe_id, regex, kind, phase, failure, fields, constants, groups, consequence, fatal = of(raw, list)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in of(fields, dict).items()):
        raise Malformed("fields")
    if not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in of(constants, dict).items()):
        raise Malformed("constants")
    if not all(isinstance(g, str) for g in of(groups, list)):
        raise Malformed("groups")
    return Probe(of(pack, str), of(probe_id, str), of(regex, str), ProbeKind(kind),
                 None if phase is None else Phase(phase), None if failure is None else FailureKind(failure),
                 dict(fields), dict(constants), tuple(groups), of(consequence, bool), of(fatal, bool))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed("int")
    return value
