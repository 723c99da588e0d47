"""A small reader of RE2 pattern syntax, for three jobs the regex engine itself cannot do.

- ``required_literals``: substrings one of which must occur in any line a pattern matches.
  The engine scans a whole batch of records for these in one RE2 pass, so lines that
  cannot match any probe cost no Python work at all.  The answer must never be wrong
  (a missing literal would lose events), so anything not understood yields ``None``,
  which means "no prefilter for this pattern" (slower, still correct).
- ``rename_groups``: prefixes every named group, so several patterns can share one
  alternation without clashing group names.
- ``to_posix_ere``: the pattern as POSIX ERE for the ``grep -E -f`` benchmark, or
  ``None`` where ERE cannot say the same thing.

The reader follows RE2's syntax (not Python's: RE2 has ``\\pN``, ``\\Q...\\E``,
``[[:alpha:]]``, and no lookaround).  It is only ever run on patterns that RE2 has
already compiled, so it need not report syntax errors of its own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

# A literal is (text, case_insensitive).
Literal = tuple[str, bool]

_MAX_ALTERNATIVES = 24  # beyond this an alternation is not worth a prefilter entry
_ESCAPED_CHARS = {"a": "\a", "f": "\f", "t": "\t", "n": "\n", "r": "\r", "v": "\v"}
_CLASS_ESCAPES = set("dDsSwWpPC")
_ZERO_WIDTH_ESCAPES = set("bBAz")
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_]\w*)>")


# ---- tokens ---------------------------------------------------------------------------


@dataclass
class _Tok:
    kind: str  # lit | any | zero | open | close | alt | quant | flags
    text: str = ""  # the literal character (lit), or the source text
    start: int = 0
    end: int = 0
    min: int = 0  # quant
    max: int | None = None  # quant
    ci: bool | None = None  # flags: the case-insensitivity a group or flag sets, if any
    name: str | None = None  # open: a named group's name
    capturing: bool = False  # open


def _tokens(pattern: str) -> list[_Tok]:
    out: list[_Tok] = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i = _escape(pattern, i, out)
        elif c == "[":
            end = _class_end(pattern, i)
            out.append(_Tok("any", pattern[i:end], i, end))
            i = end
        elif c == "(":
            i = _group_open(pattern, i, out)
        elif c == ")":
            out.append(_Tok("close", c, i, i + 1))
            i += 1
        elif c == "|":
            out.append(_Tok("alt", c, i, i + 1))
            i += 1
        elif c in "*+?":
            out.append(_Tok("quant", c, i, i + 1, min=1 if c == "+" else 0, max=1 if c == "?" else None))
            i = _lazy(pattern, i + 1, out)
        elif c == "{" and (m := _REPEAT.match(pattern, i)):
            low = int(m.group(1))
            high: int | None = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            out.append(_Tok("quant", m.group(0), i, m.end(), min=low, max=high))
            i = _lazy(pattern, m.end(), out)
        elif c in "^$":
            out.append(_Tok("zero", c, i, i + 1))
            i += 1
        elif c == ".":
            out.append(_Tok("any", c, i, i + 1))
            i += 1
        else:
            out.append(_Tok("lit", c, i, i + 1))
            i += 1
    return out


def _lazy(pattern: str, i: int, out: list[_Tok]) -> int:
    # A trailing '?' makes a quantifier lazy: same language, so only the span grows.
    if i < len(pattern) and pattern[i] == "?":
        out[-1].end = i + 1
        out[-1].text += "?"
        return i + 1
    return i


def _escape(pattern: str, i: int, out: list[_Tok]) -> int:
    if i + 1 >= len(pattern):
        out.append(_Tok("any", "\\", i, i + 1))
        return i + 1
    c = pattern[i + 1]
    if c == "Q":  # \Q...\E quotes everything up to \E
        end = pattern.find("\\E", i + 2)
        stop = len(pattern) if end < 0 else end
        for j in range(i + 2, stop):
            out.append(_Tok("lit", pattern[j], j, j + 1))
        return stop if end < 0 else end + 2
    if c == "x":
        return _hex_escape(pattern, i, out)
    if c in "pP":
        end = pattern.find("}", i) + 1 if i + 2 < len(pattern) and pattern[i + 2] == "{" else i + 3
        out.append(_Tok("any", pattern[i:end], i, end))
        return end
    if c in _CLASS_ESCAPES:
        out.append(_Tok("any", pattern[i : i + 2], i, i + 2))
    elif c in _ZERO_WIDTH_ESCAPES:
        out.append(_Tok("zero", pattern[i : i + 2], i, i + 2))
    elif c in _ESCAPED_CHARS:
        out.append(_Tok("lit", _ESCAPED_CHARS[c], i, i + 2))
    elif c.isdigit():
        # An octal escape; rare in probes, so not worth reading as a literal.
        j = i + 1
        while j < len(pattern) and j < i + 4 and pattern[j] in "01234567":
            j += 1
        out.append(_Tok("any", pattern[i:j], i, j))
        return j
    elif c.isalnum():
        out.append(_Tok("any", pattern[i : i + 2], i, i + 2))  # an escape this reader does not know
    else:
        out.append(_Tok("lit", c, i, i + 2))
    return i + 2


def _hex_escape(pattern: str, i: int, out: list[_Tok]) -> int:
    if i + 2 < len(pattern) and pattern[i + 2] == "{":
        end = pattern.find("}", i)
        digits = pattern[i + 3 : end]
        stop = end + 1
    else:
        digits = pattern[i + 2 : i + 4]
        stop = i + 4
    try:
        out.append(_Tok("lit", chr(int(digits, 16)), i, stop))
    except ValueError:
        out.append(_Tok("any", pattern[i:stop], i, stop))
    return stop


def _class_end(pattern: str, i: int) -> int:
    """Index just past the ``]`` closing the class that starts at ``i``."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1  # a ']' first in a class is a literal
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
        elif c == "[" and pattern.startswith("[:", j):
            close = pattern.find(":]", j + 2)
            j = close + 2 if close >= 0 else j + 1
        elif c == "]":
            return j + 1
        else:
            j += 1
    return len(pattern)


def _group_open(pattern: str, i: int, out: list[_Tok]) -> int:
    if not pattern.startswith("(?", i):
        out.append(_Tok("open", "(", i, i + 1, capturing=True))
        return i + 1
    named = _GROUP_NAME.match(pattern, i)
    if named:
        out.append(_Tok("open", named.group(0), i, named.end(), capturing=True, name=named.group(1)))
        return named.end()
    # (?flags) or (?flags:...)
    j = i + 2
    while j < len(pattern) and pattern[j] not in ":)":
        j += 1
    flags = pattern[i + 2 : j]
    ci = _case_flag(flags)
    if j < len(pattern) and pattern[j] == ":":
        out.append(_Tok("open", pattern[i : j + 1], i, j + 1, ci=ci))
    else:
        out.append(_Tok("flags", pattern[i : j + 1], i, j + 1, ci=ci))
    return j + 1


def _case_flag(flags: str) -> bool | None:
    on, _, off = flags.partition("-")
    if "i" in off:
        return False
    if "i" in on:
        return True
    return None


# ---- a tiny syntax tree ---------------------------------------------------------------


@dataclass
class _Node:
    kind: str  # lit | any | zero | seq | alt | rep | group
    text: str = ""
    ci: bool = False
    children: list[_Node] = field(default_factory=list)
    min: int = 0


def _parse(tokens: list[_Tok]) -> _Node:
    return _parse_alt(tokens, 0, False)[1]


def _parse_alt(tokens: list[_Tok], pos: int, ci: bool) -> tuple[int, _Node]:
    branches: list[_Node] = []
    seq: list[_Node] = []
    while pos < len(tokens):
        tok = tokens[pos]
        if tok.kind == "close":
            break
        if tok.kind == "alt":
            branches.append(_Node("seq", children=seq))
            seq = []
            pos += 1
            continue
        if tok.kind == "flags":
            ci = tok.ci if tok.ci is not None else ci
            pos += 1
            continue
        if tok.kind == "open":
            inner_ci = tok.ci if tok.ci is not None else ci
            pos, inner = _parse_alt(tokens, pos + 1, inner_ci)
            seq.append(_Node("group", children=[inner]))
            pos += 1  # the ')'
            continue
        if tok.kind == "quant":
            if seq:
                seq[-1] = _Node("rep", children=[seq[-1]], min=tok.min)
            pos += 1
            continue
        seq.append(_Node(tok.kind, text=tok.text, ci=ci and tok.kind in ("lit", "any")))
        pos += 1
    branches.append(_Node("seq", children=seq))
    return pos, branches[0] if len(branches) == 1 else _Node("alt", children=branches)


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


@functools.lru_cache(maxsize=4096)  # pure, and asked again for every engine built
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


# ---- group renaming -------------------------------------------------------------------


def rename_groups(pattern: str, prefix: str) -> str:
    """``pattern`` with every named group ``x`` renamed ``<prefix>x``."""
    pieces: list[str] = []
    last = 0
    for tok in _tokens(pattern):
        if tok.kind == "open" and tok.name is not None:
            pieces.append(pattern[last : tok.start])
            pieces.append(f"(?P<{prefix}{tok.name}>")
            last = tok.end
    pieces.append(pattern[last:])
    return "".join(pieces)


def named_groups(pattern: str) -> list[str]:
    return [t.name for t in _tokens(pattern) if t.kind == "open" and t.name is not None]


# ---- POSIX ERE export -----------------------------------------------------------------

_ERE_SPECIAL = set(".[]()*+?{}|^$\\")
_ERE_CLASS = {
    "\\d": "[0-9]",
    "\\D": "[^0-9]",
    "\\s": "[[:space:]]",
    "\\S": "[^[:space:]]",
    "\\w": "[[:alnum:]_]",
    "\\W": "[^[:alnum:]_]",
}
_ERE_IN_CLASS = {"\\d": "0-9", "\\s": "[:space:]", "\\w": "[:alnum:]_"}


def to_posix_ere(pattern: str) -> str | None:
    """``pattern`` in POSIX ERE (as GNU grep reads it), or None if it has no ERE form."""
    out: list[str] = []
    ci_stack = [False]  # case-insensitivity of each open group
    for tok in _tokens(pattern):
        ci = ci_stack[-1]
        if tok.kind == "open":
            ci_stack.append(tok.ci if tok.ci is not None else ci)
            out.append("(")
            continue
        if tok.kind == "close" and len(ci_stack) > 1:
            ci_stack.pop()
        if tok.kind == "flags":
            if tok.ci is None:
                return None
            ci_stack[-1] = tok.ci
            continue
        if ci and tok.kind == "lit" and tok.text.isalpha():
            out.append(f"[{tok.text.lower()}{tok.text.upper()}]")
            continue
        if ci and tok.kind == "any":
            return None  # a class under (?i) has no plain ERE form
        piece = _ere_token(tok)
        if piece is None:
            return None
        out.append(piece)
    return "".join(out)


def _ere_token(tok: _Tok) -> str | None:
    if tok.kind == "lit":
        if tok.text == "\n":
            return None
        return "\\" + tok.text if tok.text in _ERE_SPECIAL else tok.text
    if tok.kind == "any":
        if tok.text == ".":
            return "."
        if tok.text in _ERE_CLASS:
            return _ERE_CLASS[tok.text]
        if tok.text.startswith("["):
            return _ere_class(tok.text)
        return None
    if tok.kind == "zero":
        return {"^": "^", "$": "$", "\\b": "\\b", "\\B": "\\B"}.get(tok.text)
    if tok.kind in ("close", "alt"):
        return tok.text
    if tok.kind == "quant":
        return tok.text.rstrip("?") if len(tok.text) > 1 and tok.text.endswith("?") else tok.text
    return None  # flags


def _ere_class(text: str) -> str | None:
    body = text[1:-1]
    negate = body.startswith("^")
    if negate:
        body = body[1:]
    items: list[str] = []
    has_bracket = has_dash = False
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            esc = body[i : i + 2]
            if esc in _ERE_IN_CLASS:
                items.append(_ERE_IN_CLASS[esc])
            elif body[i + 1] in "DSWpP":
                return None
            elif body[i + 1] == "]":
                has_bracket = True
            elif body[i + 1] == "-":
                has_dash = True
            elif body[i + 1] in _ESCAPED_CHARS:
                items.append(_ESCAPED_CHARS[body[i + 1]])
            elif body[i + 1] == "\\":
                items.append("\\")
            else:
                items.append(body[i + 1])
            i += 2
        elif c == "[" and body.startswith("[:", i):
            close = body.find(":]", i)
            items.append(body[i : close + 2])
            i = close + 2
        elif c == "]" and i == 0:
            has_bracket = True
            i += 1
        else:
            items.append(c)
            i += 1
    # In a bracket expression ']' must come first and '-' last; backslash is literal.
    inner = ("]" if has_bracket else "") + "".join(items) + ("-" if has_dash else "")
    return "[" + ("^" if negate else "") + inner + "]"
