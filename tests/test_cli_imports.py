"""Every command builds the whole parser, but loads only its own verb: `probe` reads a log offline and
`completion` prints a script, so neither may pay for the daemon's client (httpx, the API's models),
~0.4 s of each start when every verb's module was imported with the parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROGRAM = """
import contextlib, io, json, sys
from supervisor.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m in (
    "httpx", "supervisor.cli.client", "supervisor.core.protocol", "supervisor.cli.jobs", "supervisor.cli.views"))}))
"""


def _loaded(*argv: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_probe_loads_nothing_of_the_client(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("Loading safetensors checkpoint shards:  50% 1/2 [00:01<00:01]\nall done\n")
    assert _loaded("probe", "--json", str(log)) == {"code": 0, "loaded": []}


def test_completion_loads_nothing_of_the_client() -> None:
    assert _loaded("completion", "bash") == {"code": 0, "loaded": []}


def test_every_verb_names_a_handler_that_exists() -> None:
    """A verb's handler is a "module:function" string, imported when the verb runs: no type checker
    follows it, so this imports every one (a renamed function would otherwise fail only when used)."""
    from supervisor.cli import verbs

    found = verbs()
    assert len(found) >= 20 and {"start", "run", "status", "probe", "completion"} <= set(found), sorted(found)
    broken = []
    for name, verb in found.items():
        try:
            handler = verb.resolve()
        except (ImportError, AttributeError) as exc:
            broken.append(f"{name} -> {verb.target}: {exc}")
            continue
        if not callable(handler):
            broken.append(f"{name} -> {verb.target}: not callable")
    assert not broken, broken


def test_completion_loads_no_pydantic() -> None:
    """The settings and the job spec's overrides (pydantic models) are loaded by the verbs that use them."""
    program = _PROGRAM.replace('"httpx", ', '"httpx", "pydantic", ')
    out = subprocess.run([sys.executable, "-c", program, "completion", "bash"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0, "loaded": []}
