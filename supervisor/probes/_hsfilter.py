"""The Hyperscan prefilter: which records of a batch some probe might match, in one pass.

Hyperscan (the optional ``hyperscan`` package) compiles every probe regex of a pack set
into one database, once (``build``, cached by the patterns).  A batch of records is joined
with ``\\n`` and scanned once; the end offset of each match names a record (``HsScanner``).
Records no probe can match are never touched by Python.  The records it names go to RE2,
which decides exactly as before, so the events are the same with or without the prefilter.

Why a hit is never missed (the prefilter may say "maybe" too often, never too rarely):

- each pattern is compiled with ``HS_FLAG_PREFILTER`` (Hyperscan may widen a pattern it
  cannot match exactly, never narrow it), in UTF-8 mode;
- its zero-width assertions (``^ $ \\b \\B \\A \\z``) are dropped first: a probe reads a line
  after its prefixes are stripped, so ``^`` may match in the middle of the record's text;
  without assertions the pattern matches wherever the line's match lies;
- a match that a probe finds inside a record ends inside it, and Hyperscan reports every
  match's end: the record holding the first end at or after a record's start is at or
  before the first record from there that any probe matches;
- RE2 folds ``k``/``s`` to the Kelvin sign and the long s under ``(?i)``: when any pattern
  is case-insensitive, those two characters are patterns of their own; a case-insensitive
  pattern holding other non-ASCII text is not given to Hyperscan.

A pattern Hyperscan refuses (or one that would cost too much to compile: see the bounds
below) is checked by RE2 alone, through the engine's literal scan.  ``SUPERVISE_PREFILTER=off``
turns the prefilter off, as does a machine without the package.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from supervisor.probes import _hscache
from supervisor.probes._kept import kept, of
from supervisor.probes._syntax import _tokens, operand_start, top_level

try:  # optional: wheels exist for x86-64 Linux only
    import hyperscan
except ImportError:  # pragma: no cover - depends on the machine
    hyperscan = None  # type: ignore[assignment]

# What one pattern, and the whole database, may cost to compile: a pack must not be able
# to freeze the daemon at load.  A pattern is checked alone only when the whole set is over
# its bounds or refused (to find which patterns to leave to RE2).  The built-in packs (143 patterns) compile in about 0.3 s
# to 0.3 MB; the slowest single one takes a few ms.
MAX_COMPILE_S_ONE = 0.5
MAX_DB_BYTES_ONE = 4 << 20
MAX_COMPILE_S = 10.0
MAX_DB_BYTES = 64 << 20
MAX_MATCHES_PER_RECORD = 32  # see HsScanner
# Characters RE2 matches case-insensitively with an ASCII letter ("k", "s").
_FOLDS_TO_ASCII = ("\u212a", "\u017f")


def _form_of(raw: Any) -> str | None:
    return None if raw is None else str(of(raw, str))


@kept("hs_form", lambda form: form, _form_of)
def hs_form(pattern: str) -> str | None:
    """``pattern`` for Hyperscan's prefilter (assertions dropped), or None if it cannot
    be given one that matches at least wherever RE2 does."""
    tokens = _tokens(pattern)
    if _folds_case(pattern) and (not pattern.isascii() or "\\x" in pattern or "\\p" in pattern or "\\P" in pattern):
        return None
    pieces: list[str] = []
    pos = 0
    for prev, tok in zip([None, *tokens], tokens, strict=False):
        if tok.kind == "quant" and prev is not None and prev.kind == "zero":
            return None  # a repeated assertion: not worth reading
        if tok.kind == "zero":
            pieces.append(pattern[pos : tok.start])
            pos = tok.end
    pieces.append(pattern[pos:])
    return _first_end_only("".join(pieces))


def _first_end_only(form: str) -> str:
    """``form`` without what its matches may or must repeat at their end: a trailing item that
    may be absent (``(?: \\[...)?``, ``.*``) is dropped, and a trailing ``\\d+`` becomes ``\\d``.

    Hyperscan reports every end of every match, each a Python call: Megatron's iteration line
    ended ten matches (``(?:.*?\\| lm loss: ...)?``) and a ``.*`` tail one a character, two
    thirds of all the calls on the corpus.  What is kept is a prefix of every match of the
    pattern (its first repetitions are a prefix of any number of them), so it matches, and ends,
    inside every record the pattern matches in: the prefilter still names each such record."""
    tokens = _tokens(form)
    if any(t.kind == "alt" for t in top_level(tokens)):
        return form  # a tail of one alternative only: ``a|b?`` is not ``a|``
    kept = _trim(form, tokens, 0)
    return kept if kept and not kept.isspace() else form


def _trim(form: str, tokens: list[Any], base: int) -> str:
    """The text of the sequence ``tokens`` (from ``form[base:]``, no alternation at its top) up to
    its last item that every match needs, that item's repetitions cut to their least."""
    while tokens:
        last = tokens[-1]
        if last.kind == "quant":
            start = operand_start(tokens[:-1])
            if start is None:
                break
            if last.min > 0:
                if last.max == last.min:
                    break
                return form[base : last.start] + ("" if last.min == 1 else f"{{{last.min}}}")
            tokens = tokens[:start]
            continue
        if last.kind == "close":  # a group: its own tail may be cut
            start = operand_start(tokens)
            inner = tokens[start + 1 : -1] if start is not None else []
            if start is not None and inner and not any(t.kind == "alt" for t in top_level(inner)):
                kept = _trim(form, inner, inner[0].start)
                if kept:
                    return form[base : tokens[start].end] + kept + ")"
        break
    return form[base : tokens[-1].end] if tokens else ""


@kept("folds_case", lambda folds: folds, lambda raw: bool(of(raw, bool)))
def _folds_case(pattern: str) -> bool:
    """Whether some part of ``pattern`` is case-insensitive (``(?i)``, ``(?si:...)``...)."""
    return any(t.ci for t in _tokens(pattern))


def disabled_reason() -> str | None:
    """Why the prefilter is off on this machine or by the environment, or None."""
    if os.environ.get("SUPERVISE_PREFILTER", "").strip().lower() in ("off", "0", "no", "false"):
        return "SUPERVISE_PREFILTER=off"
    if hyperscan is None:
        return "the hyperscan package is not installed"
    return None


@dataclass(frozen=True)
class Plan:
    """The compiled prefilter of one pattern list: ``db`` scans for ``patterns`` minus ``alone``
    (their indices, checked by RE2 alone), plus ``extra`` literal patterns."""

    db: Any
    patterns: int
    alone: tuple[int, ...]
    compile_s: float
    size: int

    def describe(self) -> str:
        return f"hyperscan prefilter, {self.patterns} patterns, {len(self.alone)} checked by RE2 alone"


def _flags(ci: bool = False) -> int:
    flags = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_UTF8
    return flags | hyperscan.HS_FLAG_CASELESS if ci else flags


def _compile(expressions: Sequence[str], flags: Sequence[int]) -> tuple[Any, float, int]:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    started = time.perf_counter()
    db.compile(expressions=[e.encode("utf-8") for e in expressions], ids=list(range(len(expressions))),
               elements=len(expressions), flags=list(flags))
    return db, time.perf_counter() - started, db.size()


@lru_cache(maxsize=16)
def build(patterns: tuple[str, ...], literals: tuple[str, ...]) -> Plan | str:
    """The prefilter for ``patterns`` (RE2 syntax) and ``literals`` (plain text, always
    given to Hyperscan), or why there is none.  Cached: one compile per pack set."""
    if any(_folds_case(p) for p in patterns):
        literals = literals + _FOLDS_TO_ASCII
    forms = [hs_form(pattern) for pattern in patterns]
    quick = _whole_set([f for f in forms if f is not None], literals)
    if quick is not None:
        return Plan(quick[0], len(patterns), tuple(i for i, f in enumerate(forms) if f is None), quick[1], quick[2])
    exprs: list[str] = []
    alone: list[int] = []
    for index, form in enumerate(forms):
        if form is None or _too_costly(form):
            alone.append(index)
        else:
            exprs.append(form)
    if len(alone) == len(patterns) and patterns:
        return "Hyperscan accepts none of the probe regexes"
    flags = [_flags()] * len(exprs) + [hyperscan.HS_FLAG_UTF8] * len(literals)
    exprs += [_escape(text) for text in literals]
    if not exprs:
        return "no probe regexes"
    try:
        db, seconds, size = _compile(exprs, flags)
    except hyperscan.error as exc:
        return f"Hyperscan refused the probe set: {exc}"
    if seconds > MAX_COMPILE_S or size > MAX_DB_BYTES:
        return f"the Hyperscan database costs too much ({seconds:.1f} s, {size >> 20} MiB)"
    return Plan(db, len(patterns), tuple(alone), seconds, size)


def _whole_set(forms: list[str], literals: tuple[str, ...]) -> tuple[Any, float, int] | None:
    """The database of every form and literal, if Hyperscan takes them all within the whole
    database's bounds: the daemon is not frozen at load, so no pattern need be checked alone (the
    143 compiles of a pattern each doubled every start).  None: find the culprits one by one."""
    if not forms:
        return None
    exprs = [*forms, *(_escape(t) for t in literals)]
    flags = [_flags()] * len(forms) + [hyperscan.HS_FLAG_UTF8] * len(literals)
    name = _hscache.key(getattr(hyperscan, "__version__", "?"), exprs, flags)
    kept = _hscache.load(hyperscan, name)
    if kept is not None:
        built = (kept[0], kept[1], kept[0].size())
    else:
        try:
            built = _compile(exprs, flags)
        except hyperscan.error:
            return None  # some pattern is refused: find which
    if built[1] > MAX_COMPILE_S or built[2] > MAX_DB_BYTES:
        return None
    if kept is None:
        _hscache.store(hyperscan, name, built[0], built[1])
    return built


@lru_cache(maxsize=4096)
def _too_costly(form: str) -> bool:
    """Whether Hyperscan refuses ``form`` alone, or compiles it too slowly or too large."""
    try:
        _db, seconds, size = _compile([form], [_flags()])
    except hyperscan.error:
        return True
    return seconds > MAX_COMPILE_S_ONE or size > MAX_DB_BYTES_ONE


def _escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == " " or not c.isascii() else f"\\x{ord(c):02x}" for c in text)


# Scratch space of one database may serve one scan at a time: each matching thread (one per
# watched attempt) has its own, for each database it scans with.
_local = threading.local()


def _scratch(db: Any) -> Any:
    spaces: dict[int, tuple[Any, Any]] = _local.__dict__.setdefault("spaces", {})
    entry = spaces.get(id(db))
    if entry is None or entry[0] is not db:
        if len(spaces) > 64:
            spaces.clear()
        entry = spaces[id(db)] = (db, hyperscan.Scratch(db))
    return entry[1]


class HsScanner:
    """The first match at or after a given offset of a joined, ANSI-stripped batch ``buf``
    (records separated by one ``\\n`` each): one scan of the whole batch, every match's end kept.

    Each match costs a Python call, and a pattern such as ``\\d+`` matches at every digit of a
    long run: past ``MAX_MATCHES_PER_RECORD`` matches a record on average (plus a margin) the
    scan stops and every record of the batch counts as a hit (read by RE2: correct, slower)."""

    def __init__(self, db: Any, buf: bytes, records: int | Callable[[], int] = 1) -> None:
        ends: list[int] = []
        add = ends.append
        # ``records`` may be a count made only when asked: the cap is never under its margin, so the
        # records are counted only once that many matches are seen (a quiet chunk's offline scan never
        # gets there, and counting 4 MiB of newlines is a third of scanning it).
        if isinstance(records, int):
            cap = MAX_MATCHES_PER_RECORD * records + 4096

            def on_match(_id: int, _start: int, end: int, _flags: int, _context: Any) -> bool:
                add(end)
                return len(ends) >= cap
        else:
            counted: Callable[[], int] | None = records
            caps = [4096]

            def on_match(_id: int, _start: int, end: int, _flags: int, _context: Any) -> bool:
                nonlocal counted
                add(end)
                if len(ends) < caps[0]:
                    return False
                if counted is not None:  # the margin reached: the real cap, from the records counted now
                    caps[0], counted = MAX_MATCHES_PER_RECORD * counted() + 4096, None
                return len(ends) >= caps[0]

        self.everything = False
        try:
            db.scan(buf, match_event_handler=on_match, scratch=_scratch(db))
        except hyperscan.ScanTerminated:
            self.everything = True
        ends.sort()  # Hyperscan does not promise to report matches in order of their end
        self._ends = ends

    def last_bytes(self) -> list[int]:
        """The offset of the last byte of every match, in order."""
        return [end - 1 for end in self._ends]

    def first_hit(self, pos: int) -> int:
        """Offset in ``buf`` (>= pos) of the last byte of the first match ending after ``pos``; -1 if none."""
        if self.everything:
            return pos
        ends = self._ends
        k = bisect_right(ends, pos)
        return ends[k] - 1 if k < len(ends) else -1
