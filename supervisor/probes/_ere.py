"""An RE2 pattern as POSIX ERE, for the ``grep -E -f`` benchmark (``None`` where ERE cannot
say the same thing)."""

from __future__ import annotations

from supervisor.probes._syntax import _ESCAPED_CHARS, _Tok, _tokens

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
