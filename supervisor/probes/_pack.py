"""Probe packs: the TOML format, its validation, and where packs are found.

A pack is one TOML file::

    name = "vllm"                 # the pack's name; probes are called "<name>.<id>"
    description = "..."
    priority = 10                 # packs are tried in ascending priority (then by name)
    tracebacks = false            # true: this pack turns on multi-line traceback capture

    [[prefixes]]                  # stripped from the start of a line, repeatedly (they stack)
    id = "proc"
    regex = '\\((?P<proc>\\w+) pid=(?P<pid>\\d+)\\) '   # named groups become event fields

    [[headers]]                   # a log header: split off to key tracebacks and read the level
    id = "logger"
    regex = '(?P<level>INFO|WARNING|ERROR) (?P<ts>\\d\\d:\\d\\d:\\d\\d) \\[(?P<src>[\\w.]+:\\d+)\\] '

    [[classify]]                  # how a failure's text maps to a FailureKind (first match wins)
    failure = "cuda_oom"
    regex = 'CUDA out of memory'

    [[probes]]
    id = "shards"
    kind = "progress"             # phase | progress | failure | metric | info
    phase = "weight_loading"      # the canonical phase this line implies (optional)
    regex = '(?P<done>\\d+)/(?P<total>\\d+) shards'
    fields = { done = "int", total = "int" }     # int | float | str | bool | duration | rate
    set = { unit = "shards" }     # constant fields added to every event of this probe
    # failure = "cuda_oom"        # failure probes only: a FailureKind, or "auto" to classify
    # consequence = true          # failure probes only: this line echoes a failure logged
                                  # earlier (see "Root cause" below)
    # fatal = true                # failure probes only: the program cannot do its work after
                                  # this line, whatever it prints next (see "Fatal" below)

    [[frames]]                    # a traceback frame that tells the phase a crash happened in
    phase = "distributed_init"
    regex = ', in (?:init_process_group|rendezvous)$'

Root cause.  A failing program often logs one failure several times: the process that broke
logs its exception, then its parent logs that the child died, a launcher logs that a rank
failed.  The attempt's failure (what ``status``, the alert and the fingerprint show) is the
*root cause*: the first error line of the earliest failing process.  Lines that only echo
another failure are recognised by pattern: a failure probe with ``consequence = true``
marks them, both as lines of their own and as a traceback's final exception line
(vLLM's ``RuntimeError: Engine core initialization failed. See root cause above.``).  A
consequence is the failure only when nothing else was logged (``_rootcause``).

Fatal.  A failure probe with ``fatal = true`` (also as a traceback's final exception line)
marks a failure after which the program is dead in effect while it may go on printing: vLLM's
engine dead behind an API server that still answers every request with an error.  The
watchdog judges it ``crashed`` once ``health.hang_after_failure_s`` has passed, whatever is
printed meanwhile and in a ready server too.

Start-up errors.  A ``ValueError``/``KeyError``/``AssertionError``/``NotImplementedError``
(a failure classified as ``value_error``, ``key_error``, ``assertion`` or
``not_implemented``) raised before ``engine_ready`` (by the phases seen so far, or by the
traceback's ``[[frames]]``) is a ``config_error``: wrong settings or code, not the box.

Every regex is compiled with RE2, which matches in linear time: a pattern RE2 cannot
compile (backreferences, lookaround) is refused.  Prefix and header regexes are matched
at the start of the line; probe regexes anywhere in the line left after the prefixes.
Any problem is a ``ProbePackError`` whose message is one line naming the file, the entry
and what is wrong.  A pack that would cost too much to match is refused too (``_limits``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import re2

from supervisor.core.errors import ProbePackError, one_line, shown
from supervisor.core.events import FailureKind, Phase, ProbeKind
from supervisor.probes import _limits

if TYPE_CHECKING:
    from pydantic import ValidationError

    from supervisor.probes._packdef import ClassifyDef, FrameDef, PackDef, ProbeDef

FIELD_TYPES = ("int", "float", "str", "bool", "duration", "rate")
AUTO_FAILURE = "auto"
_RE2_MAX_MEM = 64 << 20


@dataclass(frozen=True)
class Probe:
    """One validated probe of a pack."""

    pack: str
    id: str
    regex: str
    kind: ProbeKind
    phase: Phase | None
    failure: FailureKind | None  # None with kind FAILURE means "classify the line"
    fields: dict[str, str]  # group -> type, for the typed groups
    constants: dict[str, Any]
    groups: tuple[str, ...]  # every named group of the regex
    consequence: bool = False  # failure probes only: an echo of a failure logged earlier
    fatal: bool = False  # failure probes only: the program cannot go on after it (see "Fatal")

    @property
    def name(self) -> str:
        return f"{self.pack}.{self.id}"


@dataclass(frozen=True)
class Rule:
    """A prefix, a header, a classification rule or a frame rule of a pack."""

    pack: str
    id: str
    regex: str
    failure: FailureKind | None = None
    phase: Phase | None = None  # frame rules only


@dataclass(frozen=True)
class Pack:
    """A validated probe pack, ready for ``ProbeEngine``."""

    name: str
    source: str
    description: str = ""
    priority: int = 50
    tracebacks: bool = False
    prefixes: tuple[Rule, ...] = ()
    headers: tuple[Rule, ...] = ()
    classify: tuple[Rule, ...] = ()
    frames: tuple[Rule, ...] = ()
    probes: tuple[Probe, ...] = field(default_factory=tuple)


# ---- loading --------------------------------------------------------------------------


def parse_pack(raw: dict[str, Any], source: str) -> Pack:
    """Validate a pack already read from TOML; ``source`` names it in error messages."""
    # pydantic (0.2-0.4 s to import on a loaded machine) is imported only when a pack is
    # validated: a start whose packs are unchanged takes them from the cache (``_packcache``).
    from pydantic import ValidationError

    from supervisor.probes._packdef import PackDef

    try:
        spec = PackDef.model_validate(raw)
    except ValidationError as exc:
        raise ProbePackError(f"{source}: {_describe_validation(exc, raw)}") from exc
    _check_size(spec, source)
    return Pack(
        name=spec.name,
        source=source,
        description=spec.description,
        priority=spec.priority,
        tracebacks=spec.tracebacks,
        prefixes=tuple(_rule(spec.name, source, "prefix", r.id, r.regex) for r in spec.prefixes),
        headers=tuple(_rule(spec.name, source, "header", r.id, r.regex) for r in spec.headers),
        classify=tuple(_classify_rule(spec.name, source, i, r) for i, r in enumerate(spec.classify)),
        frames=tuple(_frame_rule(spec.name, source, i, r) for i, r in enumerate(spec.frames)),
        probes=_probes(spec, source),
    )


def _check_size(spec: PackDef, source: str) -> None:
    entries = len(spec.probes) + len(spec.prefixes) + len(spec.headers) + len(spec.classify)
    if entries > _limits.MAX_ENTRIES:
        raise ProbePackError(f"{source}: {entries} entries (probes, prefixes, headers, classify rules); "
                             f"the limit is {_limits.MAX_ENTRIES}: split the pack")
    total = 0
    for what, entry_id, regex in _regexes(spec):
        if len(regex) <= _limits.MAX_PATTERN_CHARS:  # longer ones are refused, by name, with the entry
            total += _program_size(regex)
        if total > _limits.MAX_PACK_PROGRAM_SIZE:
            raise ProbePackError(f"{source}: {what} {entry_id}: the pack's regexes compile to more than "
                                 f"{_limits.MAX_PACK_PROGRAM_SIZE} RE2 instructions in all: split the pack")


def _regexes(spec: PackDef) -> list[tuple[str, str, str]]:
    return [*(("prefix", shown(r.id), r.regex) for r in spec.prefixes),
            *(("header", shown(r.id), r.regex) for r in spec.headers),
            *(("classify rule", str(i + 1), r.regex) for i, r in enumerate(spec.classify)),
            *(("probe", shown(r.id), r.regex) for r in spec.probes)]


def _program_size(regex: str) -> int:
    try:
        return int(re2.compile(regex, re2_options()).programsize)
    except re2.error:
        return 0  # reported with its entry


def _probes(spec: PackDef, source: str) -> tuple[Probe, ...]:
    seen: set[str] = set()
    probes: list[Probe] = []
    for definition in spec.probes:
        if definition.id in seen:
            raise ProbePackError(f"{source}: probe '{definition.id}': duplicate probe id")
        seen.add(definition.id)
        probes.append(_probe(spec.name, source, definition))
    return tuple(probes)


def _probe(pack: str, source: str, d: ProbeDef) -> Probe:
    def fail(problem: str) -> ProbePackError:
        return ProbePackError(f"{source}: probe '{d.id}': {_one_line(problem)}")

    kind = _enum(ProbeKind, d.kind, "kind", fail)
    phase = _enum(Phase, d.phase, "phase", fail) if d.phase is not None else None
    failure: FailureKind | None = None
    if kind is ProbeKind.FAILURE:
        if d.failure is None:
            raise fail(f"a failure probe needs 'failure' (one of: {_choices(FailureKind)}, or '{AUTO_FAILURE}')")
        if d.failure != AUTO_FAILURE:
            failure = _enum(FailureKind, d.failure, "failure", fail)
    elif d.failure is not None:
        raise fail(f"'failure' is only for probes of kind 'failure' (this one is '{kind.value}')")
    for flag, value in (("consequence", d.consequence), ("fatal", d.fatal)):
        if value and kind is not ProbeKind.FAILURE:
            raise fail(f"'{flag}' is only for probes of kind 'failure' (this one is '{kind.value}')")
    compiled = compile_checked(d.regex, fail)
    groups = tuple(sorted(compiled.groupindex, key=lambda g: compiled.groupindex[g]))
    for name, ftype in d.fields.items():
        if ftype not in FIELD_TYPES:
            raise fail(f"field {shown(name)} has unknown type {shown(ftype)} (one of: {', '.join(FIELD_TYPES)})")
        if name not in groups:
            raise fail(f"field {shown(name)} is not a named group of the regex (groups: {', '.join(groups) or 'none'})")
    if kind is ProbeKind.PROGRESS and "done" not in groups:
        raise fail("a progress probe's regex needs a named group 'done' (and usually 'total')")
    return Probe(pack, d.id, d.regex, kind, phase, failure, dict(d.fields), dict(d.constants), groups,
                 d.consequence, d.fatal)


def _rule(pack: str, source: str, what: str, rule_id: str, regex: str) -> Rule:
    def fail(problem: str) -> ProbePackError:
        return ProbePackError(f"{source}: {what} '{rule_id}': {_one_line(problem)}")

    compile_checked(regex, fail)
    return Rule(pack, rule_id, regex)


def _classify_rule(pack: str, source: str, index: int, d: ClassifyDef) -> Rule:
    def fail(problem: str) -> ProbePackError:
        return ProbePackError(f"{source}: classify rule {index + 1} ({one_line(d.failure, 24)}): {_one_line(problem)}")

    kind = _enum(FailureKind, d.failure, "failure", fail)
    compile_checked(d.regex, fail)
    return Rule(pack, f"classify{index + 1}", d.regex, kind)


def _frame_rule(pack: str, source: str, index: int, d: FrameDef) -> Rule:
    def fail(problem: str) -> ProbePackError:
        return ProbePackError(f"{source}: frame rule {index + 1} ({d.phase}): {_one_line(problem)}")

    phase = _enum(Phase, d.phase, "phase", fail)
    compile_checked(d.regex, fail)
    return Rule(pack, f"frame{index + 1}", d.regex, phase=phase)


def _enum(enum: Any, value: str | None, what: str, fail: Any) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise fail(f"unknown {what} {shown(value, 60)} (one of: {_choices(enum)})") from None


def _choices(enum: Any) -> str:
    return ", ".join(member.value for member in enum)


# ---- regexes --------------------------------------------------------------------------


def re2_options(*, capture: bool = True) -> re2.Options:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.never_capture = not capture
    options.log_errors = False  # RE2's C++ log lines on stderr would precede our one-line error
    return options


def compile_checked(pattern: str, fail: Any) -> Any:
    """Compile ``pattern`` with RE2 or raise ``fail(problem)`` saying why RE2 refused it or why
    it would cost too much to match."""
    if len(pattern) > _limits.MAX_PATTERN_CHARS:  # checked first: RE2 would spend its time on it
        raise fail(f"regex is {len(pattern)} characters long (limit {_limits.MAX_PATTERN_CHARS})")
    try:
        compiled = re2.compile(pattern, re2_options())
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        raise fail(_why_not_re2(pattern, text)) from None
    problem = _limits.pattern_problem(pattern) or _limits.program_problem(compiled)
    if problem is not None:
        raise fail(problem)
    return compiled


def _why_not_re2(pattern: str, error: str) -> str:
    if any(token in pattern for token in ("(?=", "(?!", "(?<=", "(?<!")):
        return "uses lookaround, which RE2 does not support (probes must match in linear time)"
    if "(?P=" in pattern or any(f"\\{d}" in pattern for d in "123456789"):
        return "uses a backreference, which RE2 does not support (probes must match in linear time)"
    return f"regex does not compile with RE2: {one_line(error, 200)}"


# ---- error messages -------------------------------------------------------------------


def _describe_validation(exc: ValidationError, raw: dict[str, Any]) -> str:
    error = exc.errors()[0]
    loc = list(error["loc"])
    where = ""
    if len(loc) >= 2 and loc[0] in ("probes", "prefixes", "headers", "classify", "frames") and isinstance(loc[1], int):
        section, index = loc[0], loc[1]
        entry = raw.get(section, [])[index] if isinstance(raw.get(section), list) else {}
        entry_id = entry.get("id") if isinstance(entry, dict) else None
        label = {"probes": "probe", "prefixes": "prefix", "headers": "header", "classify": "classify rule",
                 "frames": "frame rule"}[section]
        where = f"{label} {shown(entry_id)}: " if entry_id else f"{label} {index + 1}: "
        loc = loc[2:]
    key = one_line(".".join(str(part) for part in loc), 80)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] == "missing":
        message = "missing"
    return _one_line(f"{where}{key}: {message}" if key else f"{where}{message}")


def _one_line(text: str) -> str:
    return one_line(text)
