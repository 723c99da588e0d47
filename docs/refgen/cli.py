"""reference/cli.md: every verb and flag of `supervise`, read from the argparse parser itself."""

from __future__ import annotations

import argparse
import os

from .source import cell

# argparse wraps usage lines to the terminal's width: fixed here, so the page is the same everywhere.
os.environ["COLUMNS"] = "100"


def _parser() -> argparse.ArgumentParser:
    from supervisor.cli import _parser as build

    return build()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, [], argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    return f"`{action.default}`"


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"`{name.upper() if name == action.dest else name}`" + (" (optional)" if action.nargs == "?" else "")
    takes_value = action.nargs != 0
    metavar = action.metavar or (action.dest.upper() if takes_value else "")
    shown = takes_value and (action.metavar is not None or not action.choices)  # choices are listed instead
    flags = ", ".join(f"`{o}{' ' + metavar if shown else ''}`" for o in action.option_strings)
    return flags


def _what(action: argparse.Action) -> str:
    parts = []
    if action.help and action.help != argparse.SUPPRESS:
        parts.append(action.help)
    if action.choices and not (action.help and "," in (action.help or "") and action.metavar):
        parts.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        parts.append("repeatable")
    return cell("; ".join(parts))


def _verb_section(name: str, sub: argparse.ArgumentParser) -> list[str]:
    usage = sub.format_usage().strip().removeprefix("usage: ")
    out = [f"## `supervise {name}`", "", cell(sub.description or ""), "", "```text", usage, "```", ""]
    rows = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    if rows:
        out += ["| argument | default | what |", "|---|---|---|"]
        out += [f"| {_names(a)} | {_default(a)} | {_what(a)} |" for a in rows]
        out.append("")
    return out


def render() -> str:
    parser = _parser()
    subs = _subcommands(parser)
    out = ["# Command line", "",
           "Generated from the argparse parser (`supervisor/cli/__init__.py`) by `python docs/gen_reference.py`;",
           "do not edit by hand. Every verb accepts `-h`/`--help`, which prints the same. A bad value is a usage",
           "error: one line, exit 2 (see [exit codes](exit-codes.md)).", "",
           "```text", parser.format_usage().strip().removeprefix("usage: "), "```", "",
           "| verb | what |", "|---|---|"]
    out += [f"| [`{name}`](#supervise-{name}) | {cell(sub.description or '')} |" for name, sub in subs.items()]
    out.append("")
    for name, sub in subs.items():
        out += _verb_section(name, sub)
    return "\n".join(out).rstrip() + "\n"
