"""`--set` changes a job's [params] only; the spec fields a user may change have their own flags
(`--host`, `--python`, `--workdir`, `--shards`, on `start` and `restart`) and their own keys in a
pipeline step.  A parameter named like a spec field is refused at load.  Through a real daemon."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.core.errors import SpecError

# Writes its shard index and working directory into the output directory, then ends.
JOB = """\
import os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"shard-{sys.argv[2]}-of-{sys.argv[3]}"), "w") as f:
    f.write(os.getcwd())
print("done", flush=True)
"""


def _spec(home: Path, name: str = "fields", params: str = "", extra: str = "") -> Path:
    directory = home / "specs"
    directory.mkdir(exist_ok=True)
    (directory / "job.py").write_text(JOB)
    spec = directory / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "{name}"
        command = ["{{python}}", "{directory / 'job.py'}", "{{out}}", "{{shard}}", "{{num_shards}}"]
        probes = ["python"]
        {extra}
        [params]
        out = "{home}/out/{name}"
        {params}
        [env]
        SUPERVISE_HOME = "{home}"
        [restart]
        max_attempts = 1
        """))
    return spec


def _one_line(result, code: int, *words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[-1] for w in words), lines


def test_a_parameter_named_like_a_spec_field_is_refused_at_load(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    spec = _spec(home, params='shards = "64"')  # once: `--set shards=3` ran 3 copies each loading 64 shards
    for args in ([], ["--set", "shards=3"]):
        result = supervise(daemon_env, "start", str(spec), *args, check=False)
        _one_line(result, 65, "fields.toml", "'shards'", "spec field")
    client = daemon.client()
    with pytest.raises(SpecError, match="'shards' has the name of a spec field"):  # the daemon's own check
        client.start(str(spec), {"shards": "3"})
    assert client.status().jobs == [] and not (home / "out").exists()  # nothing stored, nothing ran
    assert client.ping().pid == daemon.proc.pid


def test_set_reaches_params_only(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    spec = _spec(home)
    for key, words in [("shards", ("'shards': no such parameter", "use --shards")),
                       ("host", ("'host': no such parameter", "use --host")),
                       ("python", ("use --python",)), ("workdir", ("use --workdir",)),
                       ("name", ("'name': no such parameter",)), ("nosuch", ("'nosuch': no such parameter (known: out)",))]:
        _one_line(supervise(daemon_env, "start", str(spec), "--set", f"{key}=3", check=False), 65, *words)
    assert daemon.client().status().jobs == []


def test_the_field_flags_set_the_fields(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    spec = _spec(home)
    workdir = home / "elsewhere"
    workdir.mkdir()
    out = supervise(daemon_env, "start", str(spec), "--shards", "2", "--workdir", str(workdir),
                    "--python", sys.executable).stdout
    assert "started fields: 2 shards" in out, out
    client = daemon.client()
    wait_until(lambda: job_state(client, "fields") == "done", timeout=30)
    results = sorted((home / "out" / "fields").iterdir())
    assert [p.name for p in results] == ["shard-0-of-2", "shard-1-of-2"]
    assert {p.read_text() for p in results} == {str(workdir)}
    attempts = json.loads(supervise(daemon_env, "attempts", "fields", "--json").stdout)["attempts"]
    assert {a["argv"][0] for a in attempts} == {sys.executable}


BAD_FLAGS = [  # flags, exit code, words of the one line
    (["--shards", "abc"], 2, "expected a whole number"),
    (["--shards", "0"], 65, "shards"),
    (["--shards", "5000"], 65, "shards"),
    (["--host", "bogus://box", "--python", "/usr/bin/python3", "--workdir", "/tmp"], 65, "field 'host': unknown host 'bogus://box'"),
    (["--host", "ssh://me@box", "--python", "/usr/bin/python3", "--workdir", "relative"], 65, "`workdir` must be an absolute path"),
    (["--host", "ssh://me@box", "--workdir", "/tmp"], 65, "set `python`"),
    (["--python", "{p:>99999999}"], 65, "without '!' or ':'"),
    (["--workdir", "{nope"], 65, "bad template"),
]


@pytest.mark.parametrize("flags, code, words", BAD_FLAGS, ids=[" ".join(f[0]) for f in BAD_FLAGS])
def test_bad_field_flags_are_one_line(daemon: DaemonProcess, daemon_env, home: Path, flags: list[str], code: int,
                                      words: str) -> None:
    spec = _spec(home)
    result = supervise(daemon_env, "start", str(spec), *flags, check=False)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert words in result.stderr.strip().splitlines()[-1], result.stderr
    if code == 65:
        assert result.stderr.count("\n") == 1, result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and client.ping().pid == daemon.proc.pid


def test_restart_takes_the_field_flags(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    spec = _spec(home)
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "fields") == "done", timeout=30)
    _one_line(supervise(daemon_env, "restart", "fields", "--shards", "0", check=False), 65, "shards")
    assert len(client.attempts("fields").attempts) == 1  # refused before anything ran
    out = supervise(daemon_env, "restart", "fields", "--shards", "3").stdout
    assert "started fields: 3 shards" in out, out
    wait_until(lambda: job_state(client, "fields") == "done", timeout=30)
    assert {p.name for p in (home / "out" / "fields").iterdir()} >= {"shard-0-of-3", "shard-1-of-3", "shard-2-of-3"}
    assert client.ping().pid == daemon.proc.pid


def _pipeline(home: Path, step_keys: str) -> Path:
    _spec(home, "step")
    path = home / "specs" / "pipe.toml"
    path.write_text(textwrap.dedent(f"""\
        [pipeline]
        name = "pipe"
        [[pipeline.steps]]
        name = "only"
        job = "step"
        {step_keys}
        """))
    return path


def test_a_pipeline_step_has_its_own_field_keys(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    # Once `set = { shards = "16" }` ran 16 copies into one output directory, without a word.
    bad = _pipeline(home, 'set = { shards = "16" }')
    _one_line(supervise(daemon_env, "start", str(bad), check=False), 65, "step only", "'shards' is a spec field",
              "`shards = ...` in the step")
    good = _pipeline(home, "shards = 2")
    _one_line(supervise(daemon_env, "start", str(good), "--shards", "3", check=False), 65, "--shards applies to a job")
    _one_line(supervise(daemon_env, "start", str(good), "--set", "host=ssh://box", check=False), 65, "use --host")
    _one_line(supervise(daemon_env, "start", str(good), "--host", "bogus://box", "--python", "/usr/bin/python3",
                        "--workdir", "/tmp", check=False), 65, "step only", "host")
    client = daemon.client()
    assert client.status().jobs == []
    supervise(daemon_env, "start", str(good))
    wait_until(lambda: job_state(client, "pipe.only") == "done", timeout=30)
    assert sorted(p.name for p in (home / "out" / "step").iterdir()) == ["shard-0-of-2", "shard-1-of-2"]


def test_a_bad_host_pool_is_one_line_exit_65_and_nothing_stored(daemon: DaemonProcess, daemon_env, home: Path) -> None:
    # `hosts` with one shard is a pool the job moves along (docs/guides/verdicts.md, quarantine): each
    # entry is checked at start as `host` is, not when a relaunch first moves to it.
    for hosts, words in (('["ssh://box", "bogus://x"]', ("field 'hosts'", "unknown host 'bogus://x'", "use 'local'")),
                         ('["ssh://box", ""]', ("field 'hosts'", "unknown host ''")),
                         ('["ssh://me@box:notaport", "local"]', ("field 'hosts'", "bad SSH host", "ssh://[user@]host[:port]")),
                         ('["ssh://box", "ssh://box"]', ("`hosts` names a host twice", "list each once")),
                         ('"ssh://box"', ("field 'hosts'", "valid list")),
                         ('["ssh://box", 7]', ("field 'hosts.1'", "valid string"))):
        spec = _spec(home, "pool", extra=f'hosts = {hosts}\npython = "{sys.executable}"\nworkdir = "{home}"')
        _one_line(supervise(daemon_env, "start", str(spec), check=False), 65, "pool.toml", *words)
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid
