"""What the source says beside a definition: the comment on an enum member's or a field's line, and
the comment lines right above it.  Read with ast + tokenize, so the reference quotes the code."""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from typing import Any


def member_comments(cls: type) -> dict[str, str]:
    """name -> its comment, for each `NAME = ...` or `name: T = ...` in the class body."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = _comments_by_line(source)
    found: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        above: list[str] = []
        row = node.lineno - 1  # 1-based line above the definition
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        trailing = [comments[r] for r in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    if r in comments and not lines[r - 1].strip().startswith("#")]
        text = " ".join(above + trailing).strip()
        if text:
            found[name] = text
    return found


def _comments_by_line(source: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith(("noqa", "type:")):
                out[tok.start[0]] = text.split("  # noqa")[0]
    return out


def doc(obj: Any) -> str:
    """An object's docstring as one paragraph per blank-line-separated block."""
    return inspect.cleandoc(obj.__doc__ or "")


def cell(text: object) -> str:
    """Text fit for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")
