"""The quickstart's hang demo, as the page gives it (its `stuck.py` and `stuck.toml` read out of
docs/quickstart.md), run by a real daemon: it needs no package a wheel install lacks, hangs, is
judged stalled, relaunched, and done.  And what the spec guide says of `{attempt}` is what a
restart does."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import REPO, job_state, supervise

QUICKSTART = REPO / "docs" / "quickstart.md"


def _block(language: str, first_line: str) -> str:
    for found in re.finditer(rf"```{language}\n(.*?)```", QUICKSTART.read_text(), re.S):
        if found.group(1).startswith(first_line):
            return found.group(1)
    raise AssertionError(f"no ```{language} block starting {first_line!r} in {QUICKSTART}")


def test_the_quickstart_hang_demo_needs_no_tqdm_and_is_caught(daemon: DaemonProcess, daemon_env, home: Path,
                                                               tmp_path: Path) -> None:
    script = _block("python", "# stuck.py")
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(script))
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert imported <= set(sys.stdlib_module_names), imported  # a wheel install has no tqdm
    (tmp_path / "stuck.py").write_text(script)
    (tmp_path / "stuck.toml").write_text(_block("toml", "# stuck.toml"))
    supervise(daemon_env, "start", str(tmp_path / "stuck.toml"))
    client = daemon.client()
    wait_until(lambda: job_state(client, "stuck") == "done", timeout=90)
    attempts = client.attempts("stuck").attempts
    assert [a.verdict for a in attempts] == ["stalled", "done"], [(a.verdict, a.reason) for a in attempts]
    assert attempts[0].reason is not None and attempts[0].reason.startswith("bar 4/8 [Loading shards], no progress for ")


def test_attempt_is_counted_across_runs_as_the_spec_guide_says(daemon: DaemonProcess, daemon_env, make_job) -> None:
    guide = (REPO / "docs" / "guides" / "job-specs.md").read_text()
    assert "`{attempt}` (the job's attempt number, counted across all\nits runs" in guide
    spec = make_job("numbered", "import sys\nprint('attempt', sys.argv[1], flush=True)\n", params=', "{attempt}"')
    supervise(daemon_env, "start", str(spec), "--follow")
    supervise(daemon_env, "restart", "numbered", "--follow")
    client = daemon.client()
    logs = [Path(a.log_path).read_text() for a in client.attempts("numbered").attempts]
    assert logs == ["attempt 1\n", "attempt 2\n"], logs  # the second run's first attempt is 2, not 1
