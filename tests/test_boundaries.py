"""Who may read what: runners are read through their snapshot, and the metrics through the
reader the daemon hands them, never by importing the daemon."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "supervisor"


def _trees() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE)): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def test_only_the_runner_touches_its_live_attempt_and_watchdog() -> None:
    reaching_in = sorted(
        f"{name}:{node.lineno} .{node.attr}"
        for name, tree in _trees().items() if not name.startswith("jobs/runner/")
        for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in ("live", "watchdog")
    )
    assert reaching_in == []


def test_metrics_do_not_import_the_daemon() -> None:
    tree = _trees()["daemon/metrics.py"]
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"daemon", "service", "api", "supervisor.daemon.process", "supervisor.daemon.service", "supervisor.daemon.api"}
