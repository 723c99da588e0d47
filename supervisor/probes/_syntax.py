"""A small reader of RE2 pattern syntax: tokens, a parse tree, and named-group renaming.

It serves three jobs the regex engine itself cannot do (the first two in sibling modules):

- ``required_literals`` (``_literals``): substrings one of which must occur in any line a pattern matches.
  The engine scans a whole batch of records for these in one RE2 pass, so lines that
  cannot match any probe cost no Python work at all.  The answer must never be wrong
  (a missing literal would lose events), so anything not understood yields ``None``,
  which means "no prefilter for this pattern" (slower, still correct).
- ``rename_groups``: prefixes every named group, so several patterns can share one
  alternation without clashing group names.
- ``to_posix_ere`` (``_ere``): the pattern as POSIX ERE for the ``grep -E -f`` benchmark, or
  ``None`` where ERE cannot say the same thing.
- ``without_optional_tail``: the pattern without the trailing items every match may skip, for
  reading a few of its groups faster (the offline fold of a bar's run, ``_barfold``).

The reader follows RE2's syntax (not Python's: RE2 has ``\\pN``, ``\\Q...\\E``,
``[[:alpha:]]``, and no lookaround).  It is only ever run on patterns that RE2 has
already compiled, so it need not report syntax errors of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A literal is (text, case_insensitive).
Literal = tuple[str, bool]

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


# ---- tails ------------------------------------------------------------------------------


def top_level(tokens: list[_Tok]) -> list[_Tok]:
    """The tokens outside every group."""
    depth = 0
    out: list[_Tok] = []
    for tok in tokens:
        if tok.kind == "open":
            depth += 1
        elif tok.kind == "close":
            depth -= 1
        elif depth == 0:
            out.append(tok)
    return out


def operand_start(tokens: list[_Tok]) -> int | None:
    """Index of the first token of what a quantifier after ``tokens`` repeats (a group or one item)."""
    if not tokens:
        return None
    last = tokens[-1]
    if last.kind in ("lit", "any"):
        return len(tokens) - 1
    if last.kind != "close":
        return None
    depth = 0
    for index in range(len(tokens) - 1, -1, -1):
        kind = tokens[index].kind
        depth += 1 if kind == "close" else -1 if kind == "open" else 0
        if depth == 0:
            return index
    return None


def without_optional_tail(pattern: str, keep: frozenset[str]) -> str:
    """``pattern`` without its trailing items that may match nothing (``(?:.*?\\| loss: (?P<x>..))?``,
    ``\\s*``), unless one holds a group named in ``keep``; the pattern itself if none.

    Where the pattern matches, so does the rest, from the same start; and under RE2's
    leftmost-first rule the groups of the rest take the same spans (the first way the rest
    matches is kept, since the tail after it always matches, if only nothing).  Megatron's
    iteration line is 300 bytes, and its optional loss part costs most of the match."""
    tokens = _tokens(pattern)
    if any(t.kind == "alt" for t in top_level(tokens)):
        return pattern  # the tail of one alternative is not the pattern's
    cut = len(pattern)
    while tokens and tokens[-1].kind == "quant" and tokens[-1].min == 0:
        start = operand_start(tokens[:-1])
        if start is None or any(t.kind == "open" and t.name in keep for t in tokens[start:]):
            break
        tokens = tokens[:start]
        cut = tokens[-1].end if tokens else 0
    return pattern[:cut] if tokens else pattern
