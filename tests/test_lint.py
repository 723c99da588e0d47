"""The guards that keep the code honest, run as part of the suite: ruff (over supervisor/ and the job
programs in jobs/), mypy --strict and the import contracts (layers), each configured in pyproject.toml.
CI installs all three with the test extra."""

from __future__ import annotations

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
    done = _run(_tool("ruff"), "check", "--no-cache", "supervisor", "jobs")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.timeout(600)
def test_mypy_strict_finds_nothing() -> None:
    done = _run(_tool("mypy"), "--no-incremental", "--cache-dir", "/dev/null")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_import_contracts_are_kept() -> None:
    done = _run(_tool("lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
