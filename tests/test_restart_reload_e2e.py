"""`restart` after the spec file was edited: never silently the old spec.  Without --reload the job
restarts with the spec it was started with and says the file changed (and which fields); with
--reload it takes the file and says what changed.  A real daemon, the real CLI, real files."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

JOB = "import sys\nprint('grace', sys.argv[1], flush=True)\n"


def _spec(home: Path, grace: int, extra: str = "") -> Path:
    specs = home / "specs"
    specs.mkdir(exist_ok=True)
    (specs / "edited.py").write_text(JOB)
    spec = specs / "edited.toml"
    spec.write_text(f'name = "edited"\ncommand = ["{{python}}", "{specs / "edited.py"}", "{{tag}}"]\n'
                    f'stop_grace_s = {grace}\n[params]\ntag = "first"\n{extra}')
    return spec


def test_restart_says_the_file_changed_and_reload_takes_it(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    spec = _spec(home, 2)
    supervise(daemon_env, "start", str(spec), "--follow")
    spec.write_text(spec.read_text().replace("stop_grace_s = 2", "stop_grace_s = 3").replace('"first"', '"second"'))
    client = daemon.client()

    out = supervise(daemon_env, "restart", "edited", "--follow").stdout
    [note] = [line for line in out.splitlines() if "note:" in line]
    assert f"{spec.resolve()} changed since edited was started (params.tag, stop_grace_s)" in note, out
    assert "restart edited --reload" in note, out
    assert client.status("edited").jobs[0].attempt is not None
    last = client.attempts("edited").attempts[-1]
    assert "grace first" in Path(last.log_path).read_text()  # the spec it was started with, as said

    out = supervise(daemon_env, "restart", "edited", "--reload", "--follow").stdout
    [note] = [line for line in out.splitlines() if "note:" in line]
    assert note.endswith(f"took {spec.resolve()} anew: changed params.tag, stop_grace_s"), out
    last = client.attempts("edited").attempts[-1]
    assert "grace second" in Path(last.log_path).read_text()
    wait_until(lambda: job_state(client, "edited") == "done")

    out = supervise(daemon_env, "restart", "edited", "--follow").stdout  # the file and the job agree now
    assert "note:" not in out, out


@pytest.mark.parametrize("edit, words", [
    ("stop_grace_s = -1", "stop_grace_s"),
    ('name = "other"', "now names job 'other'"),
    ("[params]", "params"),  # a table written twice: not TOML
])
def test_reload_of_a_bad_file_is_one_line_65_and_the_job_is_left_as_it_was(daemon: DaemonProcess, daemon_env,
                                                                           home: Path, edit: str, words: str) -> None:
    spec = _spec(home, 2)
    supervise(daemon_env, "start", str(spec), "--follow")
    client = daemon.client()
    before = client.attempts("edited").attempts
    text = spec.read_text()
    spec.write_text(text.replace('name = "edited"', edit) if edit.startswith("name") else text + edit + "\n")
    result = supervise(daemon_env, "restart", "edited", "--reload", check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert client.attempts("edited").attempts == before  # nothing stopped, nothing started
    # Without --reload the stored spec still runs, and the broken file is said.
    out = supervise(daemon_env, "restart", "edited").stdout
    assert "restarted with the spec it was started with" in out, out
    assert client.ping().pid == daemon.proc.pid


def test_the_restart_route_refuses_a_reload_that_is_not_a_boolean(daemon: DaemonProcess, home: Path) -> None:
    spec = _spec(home, 2)
    client = daemon.client()
    client.start(str(spec), {})
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(home / "daemon.sock")), base_url="http://supervise") as http:
        answer = http.post("/v1/jobs/edited/restart", json={"reload": "yes"})
    assert answer.status_code == 400 and "reload" in answer.text and answer.text.count("\n") <= 1, answer.text
    assert client.ping().pid == daemon.proc.pid
