"""The guards that keep the code honest, run as part of the suite: ruff (over supervisor/, the job
programs in jobs/ and the tests themselves), mypy --strict and the import contracts (layers), each configured in pyproject.toml.
CI installs all three with the test extra."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' installs it")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing() -> None:
    done = _run(_tool("ruff"), "check", "--no-cache", "supervisor", "jobs", "tests")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.timeout(600)
def test_mypy_strict_finds_nothing() -> None:
    done = _run(_tool("mypy"), "--no-incremental", "--cache-dir", "/dev/null")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_import_contracts_are_kept() -> None:
    done = _run(_tool("lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize(("module", "bad_import", "contract"), [
    ("core/events.py", "supervisor.cli.client", "The layers, top to bottom"),
    ("watchdog/_judge.py", "supervisor.daemon.api", "The layers, top to bottom"),
    ("hosts/local/host.py", "supervisor.hosts.ssh.host", "Host kinds"),
    ("watchdog/_judge.py", "supervisor.core.bus", "The watchdog judges facts"),
    ("hosts/registry.py", "supervisor.watchdog", "Hosts launch and follow"),
    ("jobs/matching.py", "supervisor.store.database", "The matcher reads text"),
    ("daemon/api/_routes.py", "supervisor.jobs.runner", "The daemon's API and page"),
])
def test_one_bad_import_breaks_one_contract(tmp_path: Path, module: str, bad_import: str, contract: str) -> None:
    """The contracts do not overlap: a wrong import is told once, by the contract that says why it is
    wrong, not by every contract whose modules it happens to chain together."""
    shutil.copytree(ROOT / "supervisor", tmp_path / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "supervisor" / module).open("a", encoding="utf-8") as f:
        f.write(f"\nimport {bad_import}  # the wrong import under test\n")
    done = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"})
    lines = " ".join(done.stdout.split())  # a long contract name is wrapped across lines
    listing = lines.split(" dependencies.", 1)[-1].split("Contracts: ", 1)[0].strip(" -")  # "Name KEPT Name BROKEN"
    # A name that fills its line is printed with no space before its verdict: "...each otherBROKEN".
    verdicts = re.findall(r"(.+?)(KEPT|BROKEN)(?= |$)", listing)
    broken = [name.strip(" -") for name, verdict in verdicts if verdict == "BROKEN"]
    assert "Contracts: " in lines and ", 1 broken." in lines, done.stdout[-3000:] + done.stderr[-1000:]
    assert len(broken) == 1 and contract in broken[0], broken
