"""Required literals of an RE2 pattern: substrings one of which must occur in any line it
matches (the engine's prefilter), and the characters a match can start with.  Anything not
understood yields ``None`` ("no prefilter"): slower, never wrong."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from supervisor.probes._kept import kept, of
from supervisor.probes._syntax import Literal, _Node, _parse, _tokens

_MAX_ALTERNATIVES = 24  # beyond this an alternation is not worth a prefilter entry


# ---- required literals ----------------------------------------------------------------


@dataclass
class _Info:
    exact: list[Literal] | None  # the node matches exactly this run of literal characters
    required: set[Literal] | None  # one of these must occur; None: nothing known


def _best(candidates: list[set[Literal]]) -> set[Literal] | None:
    best: set[Literal] | None = None
    for cand in candidates:
        if not cand or len(cand) > _MAX_ALTERNATIVES:
            continue
        if best is None or _score(cand) > _score(best):
            best = cand
    return best


def _score(cand: set[Literal]) -> tuple[int, int]:
    # The shortest alternative decides how selective a set is; fewer alternatives break ties.
    return min(len(text) for text, _ in cand), -len(cand)


def _run_literal(run: list[Literal]) -> set[Literal]:
    # A run mixing case-sensitive and -insensitive characters is split at each change;
    # the longest piece is kept.
    pieces: list[Literal] = []
    for ch, ci in run:
        if pieces and pieces[-1][1] == ci:
            pieces[-1] = (pieces[-1][0] + ch, ci)
        else:
            pieces.append((ch, ci))
    text, ci = max(pieces, key=lambda p: len(p[0]))
    return {(text.lower() if ci else text, ci)}


def _info(node: _Node) -> _Info:
    if node.kind == "lit":
        return _Info([(node.text, node.ci)], {(node.text.lower() if node.ci else node.text, node.ci)})
    if node.kind in ("any", "zero"):
        return _Info(None, None)
    if node.kind == "group":
        return _info(node.children[0])
    if node.kind == "rep":
        inner = _info(node.children[0])
        if node.min < 1:
            return _Info(None, None)
        required = _run_literal(inner.exact) if inner.exact else inner.required
        return _Info(None, required)
    if node.kind == "alt":
        return _alt_info(node)
    return _seq_info(node)


def _alt_info(node: _Node) -> _Info:
    union: set[Literal] = set()
    for branch in node.children:
        info = _info(branch)
        required = _run_literal(info.exact) if info.exact else info.required
        if not required:
            return _Info(None, None)
        union |= required
    return _Info(None, union if len(union) <= _MAX_ALTERNATIVES else None)


def _seq_info(node: _Node) -> _Info:
    candidates: list[set[Literal]] = []
    run: list[Literal] = []
    exact_all = True
    for child in node.children:
        info = _info(child)
        if info.exact is not None:
            run.extend(info.exact)
            continue
        exact_all = False
        repeated = _repeated_exact(child)
        if repeated is not None:
            # "x+": its first copy touches what comes before, its last what comes after.
            run.extend(repeated)
            candidates.append(_run_literal(run))
            run = list(repeated)
            continue
        if run:
            candidates.append(_run_literal(run))
            run = []
        if info.required:
            candidates.append(info.required)
    if exact_all:
        return _Info(run, _run_literal(run) if run else None)
    if run:
        candidates.append(_run_literal(run))
    return _Info(None, _best(candidates))


def _repeated_exact(node: _Node) -> list[Literal] | None:
    """The fixed text repeated by ``x+`` / ``x{2,}``-style nodes, else None."""
    if node.kind != "rep" or node.min < 1:
        return None
    return _info(node.children[0]).exact


def _literals_of(raw: Any) -> tuple[Literal, ...] | None:
    if raw is None:
        return None
    found = []
    for item in of(raw, list):
        text, ci = of(item, list)
        found.append((of(text, str), of(ci, bool)))
    return tuple(found)


@functools.lru_cache(maxsize=4096)  # pure, and asked again for every engine built
@kept("required_literals", lambda found: None if found is None else [list(f) for f in found], _literals_of)
def required_literals(pattern: str) -> tuple[Literal, ...] | None:
    """Literals one of which occurs in every match of ``pattern``; None when none is known.

    Case-insensitive literals come back lower-cased with the flag set.
    """
    try:
        info = _info(_parse(_tokens(pattern)))
    except (IndexError, ValueError):
        return None
    required = _run_literal(info.exact) if info.exact else info.required
    if not required or any(not text for text, _ in required):
        return None
    return tuple(sorted(required))


# ---- first characters -----------------------------------------------------------------


def _first(node: _Node) -> tuple[set[str] | None, bool]:
    """(characters a match can start with, or None for any; whether it can be empty)."""
    if node.kind == "lit":
        return ({node.text.lower(), node.text.upper()} if node.ci else {node.text}), False
    if node.kind == "any":
        chars = _class_chars(node.text)
        if chars is not None and node.ci:
            chars = {c.lower() for c in chars} | {c.upper() for c in chars}
        return chars, False
    if node.kind == "zero":
        return set(), True
    if node.kind in ("group", "rep"):
        chars, nullable = _first(node.children[0])
        return chars, nullable or (node.kind == "rep" and node.min == 0)
    if node.kind == "alt":
        union: set[str] = set()
        any_nullable = False
        for branch in node.children:
            chars, nullable = _first(branch)
            if chars is None:
                return None, False
            union |= chars
            any_nullable = any_nullable or nullable
        return union, any_nullable
    acc: set[str] = set()
    for child in node.children:
        chars, nullable = _first(child)
        if chars is None:
            return None, False
        acc |= chars
        if not nullable:
            return acc, False
    return acc, True


_CLASS_SHORTHANDS = {"\\d": "0123456789", "\\w": "0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}


def _class_chars(text: str) -> set[str] | None:
    """The characters of a simple class such as ``[A-Za-z0-9_]`` or ``\\d``; None if unknown
    (negated classes, other escapes, POSIX names)."""
    if text in _CLASS_SHORTHANDS:
        return set(_CLASS_SHORTHANDS[text])
    if not (text.startswith("[") and text.endswith("]")) or text.startswith("[^") or "[:" in text:
        return None
    body, chars, i = text[1:-1], set(), 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            esc = body[i : i + 2]
            if esc in _CLASS_SHORTHANDS:
                chars |= set(_CLASS_SHORTHANDS[esc])
            elif len(esc) == 2 and not esc[1].isalnum():
                chars.add(esc[1])
            else:
                return None
            i += 2
        elif i + 2 < len(body) and body[i + 1] == "-":
            if ord(body[i + 2]) - ord(c) > 256:
                return None
            chars |= {chr(o) for o in range(ord(c), ord(body[i + 2]) + 1)}
            i += 3
        else:
            chars.add(c)
            i += 1
    return chars


@functools.lru_cache(maxsize=4096)
def first_chars(pattern: str) -> frozenset[str] | None:
    """The characters a match of ``pattern`` (anchored at its start) can begin with;
    None when that is not known or a match can be empty."""
    try:
        chars, nullable = _first(_parse(_tokens(pattern)))
    except (IndexError, ValueError):
        return None
    if chars is None or nullable:
        return None
    return frozenset(chars)
