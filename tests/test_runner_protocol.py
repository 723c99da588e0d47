"""The jobs' owner holds every job's runner as a ``Runner`` (jobs/runner_protocol.py), which a job's
``JobRunner`` and a sharded job's ``ShardedJob`` both implement (mypy --strict checks the members'
types, test_lint.py): nothing that holds runners asks which kind one is, and only the owner's
factory names the two kinds.  Read from the source (AST) and the classes, no daemon."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.jobs.runner import JobRunner
from supervisor.jobs.runner_protocol import Runner
from supervisor.jobs.sharding import ShardedJob

JOBS = Path(__file__).resolve().parents[1] / "supervisor" / "jobs"
HOLDERS = ("owner.py", "stopping.py", "recovery.py", "pipelines.py")
KINDS = {"JobRunner", "ShardedJob"}


def _members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_both_kinds_have_every_member_of_a_runner() -> None:
    wanted = _members(Runner)
    assert wanted >= {"task", "news", "running", "error", "snapshot", "stop", "detach", "hold", "release"}
    for kind in (JobRunner, ShardedJob):
        made = set(dir(kind))  # attributes set in __init__ (task, news, error) are read from an instance below
        missing = {m for m in wanted if m not in made and m not in {"task", "news", "error"}}
        assert not missing, (kind.__name__, missing)


def _asks_the_kind(tree: ast.AST) -> list[int]:
    """Lines that ask which kind a runner is: isinstance against a kind, or a union of the kinds."""
    found = []
    for node in ast.walk(tree):
        is_kind_check = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                         and any(isinstance(n, ast.Name) and n.id in KINDS for n in ast.walk(node.args[1])))
        is_kind_union = (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                         and {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} >= KINDS)
        if is_kind_check or is_kind_union:
            found.append(node.lineno)
    return found


def test_what_holds_runners_never_asks_their_kind() -> None:
    strays = [f"{name}:{line}" for name in HOLDERS for line in _asks_the_kind(ast.parse((JOBS / name).read_text()))]
    assert not strays, strays


def test_only_the_owners_factory_names_a_job_runner() -> None:
    tree = ast.parse((JOBS / "owner.py").read_text())
    callers = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
               for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "JobRunner"}
    assert callers == {"_made"}
