"""An attempt's live state (``Live``, jobs/runner/_context.py) is split by owner, and each part is
written by its owner's module only: what the watch read by the watch, the kill and its stacks by
the verdict module, how the command ended by the ending, the processes seen by the runner's loop,
what the program said on its socket by the heartbeat.  The handles are frozen.  Held by reading
every module's source (AST), like the one writer of attempt ends (test_attempt_transitions.py)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from supervisor.jobs.runner import _context

SUPERVISOR = Path(__file__).resolve().parents[1] / "supervisor"
JOBS = SUPERVISOR / "jobs"  # where an attempt's Live is made and kept (nothing outside the jobs domain sees one)

# Live's attribute -> (the class of that part, the one module that writes it)
OWNERS = {
    "reading": (_context.Reading, "jobs/runner/_watching.py"),
    "kill": (_context.Kill, "jobs/runner/_verdict.py"),
    "end": (_context.End, "jobs/runner/_ending.py"),
    "procs": (_context.Processes, "jobs/runner/_job.py"),
    "notified": (_context.Notified, "jobs/runner/_heartbeat.py"),
}
PARTS = {f.name for f in dataclasses.fields(_context.Live)}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        return found
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _part(value: ast.expr) -> str | None:
    """The part of ``Live`` an attribute is set on: ``live.kill.x = …`` or ``kill.x = …`` (a local
    bound to the part, as a callback does)."""
    if isinstance(value, ast.Attribute) and value.attr in OWNERS:
        return value.attr
    if isinstance(value, ast.Name) and value.id in OWNERS:
        return value.id
    return None


def writes(source: str) -> list[tuple[str, str, int]]:
    """(part, field, line) of each write of a part of ``Live`` in ``source``; a part itself
    replaced (``live.kill = …``) is a write of the part's every field."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if not isinstance(target, ast.Attribute):
                continue
            part = _part(target.value)
            if part is not None and target.attr in {f.name for f in dataclasses.fields(OWNERS[part][0])}:
                found.append((part, target.attr, node.lineno))
            elif target.attr in PARTS and target.attr in OWNERS:
                found.append((target.attr, "*", node.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            part = _part(node.args[0])
            if part is not None:
                found.append((part, "setattr", node.lineno))
    return found


def test_the_scan_finds_each_form_of_write() -> None:
    source = ("live.reading.last_output = 1\nlive.kill.killed_by_us = True\nkill.stacks_pending = None\n"
              "live.procs.known_pids |= {1}\nlive.end = End()\nsetattr(live.kill, 'stacks', None)\n"
              "live.row.log_offset = 3\nself.reading = None\n")
    assert [(p, f) for p, f, _ in writes(source)] == [
        ("reading", "last_output"), ("kill", "killed_by_us"), ("kill", "stacks_pending"), ("procs", "known_pids"),
        ("end", "*"), ("reading", "*"), ("kill", "setattr")]


def test_each_part_of_an_attempts_live_state_is_written_by_its_owner_only() -> None:
    strays = []
    for path in sorted(JOBS.rglob("*.py")):
        where = path.relative_to(SUPERVISOR).as_posix()
        for part, name, line in writes(path.read_text()):
            if where != OWNERS[part][1]:
                strays.append(f"{where}:{line} writes Live.{part}.{name} (owned by {OWNERS[part][1]})")
    assert not strays, strays


def test_the_handles_are_set_once() -> None:
    assert _context.Handles.__dataclass_params__.frozen  # type: ignore[attr-defined]
    # Every part is one of the owned ones, or the handles: no field of Live is left without an owner.
    assert set(OWNERS) | {"handles"} == PARTS
