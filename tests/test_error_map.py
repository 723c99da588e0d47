"""The error map, end to end through a real daemon: for each class of bad input it can meet,
the CLI exits with the documented code (docs/reference/exit-codes.md) and one line, the client raises
the same class the daemon found, and no job is left in a state nobody can leave."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.core.errors import (
    TABLE,
    AlreadyRunning,
    ConnectionLost,
    NotFound,
    ProbePackError,
    SpecError,
    SuperviseError,
)

BROKEN_PACK = """\
name = "broken"
[[probes]]
id = "bad"
kind = "info"
regex = '(unclosed'
"""

# Waits for a gate file, so it is surely running when started a second time.
GATED_JOB = """\
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


@dataclass(frozen=True)
class BadStart:
    job: str
    spec: str  # spec lines besides name and command; {home} is the test's state directory
    error: type[SuperviseError]
    exit_code: int
    message: str  # a regex the one line must match


BAD_STARTS = [
    BadStart("unknown-pack", 'probes = ["no-such-pack"]', ProbePackError, 65,
             r"unknown probe pack 'no-such-pack' \(searched "),
    BadStart("broken-pack", 'probe_files = ["{home}/broken.toml"]', ProbePackError, 65,
             r"broken\.toml: .*'bad'"),
    BadStart("missing-probe-file", 'probe_files = ["{home}/nowhere.toml"]', ProbePackError, 65,
             r"nowhere\.toml: cannot read probe pack: No such file or directory"),
    BadStart("bad-field", "stop_grace_s = -1", SpecError, 65,
             r"bad-field\.toml: field 'stop_grace_s': .*greater than or equal to 0"),
    BadStart("unreachable", 'host = "ssh://nobody@127.0.0.1:1"\npython = "/usr/bin/python3"\nworkdir = "/tmp"',
             ConnectionLost, 69, r"could not start unreachable: connection refused \(nobody@127\.0\.0\.1:1\)"),
]


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], home: Path) -> dict[str, str]:
    # An unreachable host is given up on after 1 s instead of a minute; user packs live in home/packs.
    return {**daemon_env, "SUPERVISE_SSH_RETRY_S": "1", "SUPERVISE_PROBE_PATH": str(home / "packs")}


def _one_line(stderr: str) -> str:
    """The CLI's whole complaint: exactly one line, 'supervise: ...', and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("supervise: "), stderr
    return lines[0].removeprefix("supervise: ")


def _jobs(env: dict[str, str]) -> dict[str, str]:
    status = json.loads(supervise(env, "status", "--json").stdout)
    return {job["name"]: job["state"] for job in status["jobs"]}


def _write_spec(home: Path, case: BadStart) -> Path:
    (home / "broken.toml").write_text(BROKEN_PACK)
    spec = home / f"{case.job}.toml"
    spec.write_text(f'name = "{case.job}"\ncommand = ["{{python}}", "-c", "print(1)"]\n'
                    + case.spec.replace("{home}", str(home)) + "\n")
    return spec


@pytest.mark.parametrize("case", BAD_STARTS, ids=[c.job for c in BAD_STARTS])
def test_bad_start_exits_with_its_code_and_leaves_no_job_stuck(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                              home: Path, case: BadStart) -> None:
    spec = _write_spec(home, case)
    result = supervise(daemon_env, "start", str(spec), check=False)
    line = _one_line(result.stderr)
    assert result.returncode == case.exit_code, (result.returncode, line)
    assert re.search(case.message, line), line
    # The daemon's own check (the CLI checks a spec's fields before sending it): the same class.
    with pytest.raises(case.error) as raised:
        daemon.client().start(str(spec), {})
    assert type(raised.value) is case.error and raised.value.exit_code == case.exit_code
    assert re.search(case.message, str(raised.value))
    jobs = _jobs(daemon_env)
    assert "starting" not in jobs.values(), jobs
    assert case.job not in jobs  # refused before anything was stored (a closed port too: checked at start)
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_error_body_carries_kind_and_exit_code(daemon: DaemonProcess, home: Path) -> None:
    spec = _write_spec(home, BAD_STARTS[0])
    transport = httpx.HTTPTransport(uds=str(daemon.paths.socket))
    with httpx.Client(transport=transport, base_url="http://supervise") as http:
        response = http.post("/v1/jobs", json={"spec_path": str(spec)})
    body = response.json()
    assert (response.status_code, body["kind"], body["exit_code"]) == (422, "probe_pack", 65)
    assert body["error"].startswith("unknown probe pack 'no-such-pack'")


def test_unknown_job_is_66_everywhere(daemon: DaemonProcess, daemon_env: dict[str, str]) -> None:
    for command in ("status", "stop", "logs", "events", "attempts", "report"):
        result = supervise(daemon_env, command, "no-such-job", check=False)
        line = _one_line(result.stderr)
        assert result.returncode == 66, (command, result.returncode, line)
        assert line == "no job named 'no-such-job'; `supervise jobs` lists the known ones", command


def test_unknown_job_is_not_found_through_the_client(daemon: DaemonProcess) -> None:
    client = daemon.client()
    for call in (lambda: client.stop("no-such-job", None), lambda: client.attempts("no-such-job"),
                 lambda: client.events("no-such-job"), lambda: list(client.follow_log("no-such-job", attempt=None, follow=False))):
        with pytest.raises(NotFound):
            call()


def test_starting_a_running_job_is_75(daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("gated", GATED_JOB, params=f', "{gate}"')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "gated") == "running")
    result = supervise(daemon_env, "start", str(spec), check=False)
    line = _one_line(result.stderr)
    assert result.returncode == 75, (result.returncode, line)
    assert line == "job 'gated' is already running; `supervise stop gated` first"
    with pytest.raises(AlreadyRunning):
        client.start(str(spec), {})
    assert _jobs(daemon_env) == {"gated": "running"}
    assert len(client.attempts("gated").attempts) == 1  # nothing launched twice
    gate.touch()
    wait_until(lambda: job_state(client, "gated") == "done")


def test_a_pack_gone_while_the_daemon_was_down_fails_its_job_not_the_daemon(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    packs = home / "packs"
    packs.mkdir()
    (packs / "mine.toml").write_text('name = "mine"\n[[probes]]\nid = "hello"\nkind = "info"\nregex = "hello"\n')
    gate = home / "gate"
    spec = make_job("gated", GATED_JOB, params=f', "{gate}"', probes='["python", "mine"]')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "gated") == "running")
    daemon.kill(signal.SIGKILL)
    (packs / "mine.toml").unlink()
    daemon.start()  # recovery cannot build the job's runner: start-up goes on
    status = daemon.client().status("gated").jobs[0]
    assert status.state == "failed" and "unknown probe pack 'mine'" in status.reason, status


EXIT_CODES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "exit-codes.md"


def _readme_exit_codes() -> dict[int, str]:
    """The documented exit-code table (docs/reference/exit-codes.md, made by docs/gen_reference.py):
    code -> the verbs it names."""
    page = EXIT_CODES_PAGE.read_text()
    section = page[page.index("## Exit codes"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| *(\d+) *\| *([^|]+?) *\| *([^|]+?) *\|$", section, re.MULTILINE)
    assert rows, f"{EXIT_CODES_PAGE} has no exit-code table"
    return {int(code): verbs for code, _, verbs in rows}


def _drawn_tree() -> dict[str, str]:
    """Each class the tree in core/errors.py's docstring draws, with the class drawn above it."""
    import supervisor.core.errors as errors

    parents: dict[str, str] = {}
    above: list[str] = []  # the class drawn last at each depth
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^( *)((?:[│ ] {3})*)(?:[├└]── )?([A-Z]\w+)(?:\s|$)", line)
        if found is None or not (found.group(3) == "SuperviseError" or "── " in line):
            continue
        depth = len(found.group(2)) // 4 + (1 if "── " in line else 0)
        del above[depth:]
        if depth:
            parents[found.group(3)] = above[depth - 1]
        above.append(found.group(3))
    return parents


def test_the_exception_tree_drawn_is_the_classes_defined() -> None:
    """The tree in core/errors.py's docstring is the map of what the CLI may say: every class that
    derives from SuperviseError is drawn, under the class it derives from, and nothing else is."""
    import supervisor.core.errors as errors

    defined = {name: cls.__bases__[0].__name__ for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, SuperviseError) and cls is not SuperviseError}
    assert _drawn_tree() == defined


def test_readme_table_lists_exactly_the_codes_the_cli_uses() -> None:
    used = {row.cls.exit_code for row in TABLE} | {0, 1, 2}  # ok, job failed (and probe's crash), argparse usage
    assert set(_readme_exit_codes()) == used


@dataclass(frozen=True)
class Verb:
    argv: tuple[str, ...]
    code: int


# One daemon, every verb: `ok` is done, `bad` failed, `gated` runs; `typo` is a misspelt spec.
VERBS = [
    Verb(("--version",), 0), Verb(("jobs",), 0), Verb(("gpus",), 0), Verb(("config", "show"), 0), Verb(("daemon",), 0),
    Verb(("status",), 0), Verb(("status", "ok"), 0), Verb(("status", "bad"), 1), Verb(("status", "bad", "--json"), 1),
    Verb(("attempts", "ok"), 0), Verb(("logs", "ok", "-n", "1"), 0), Verb(("events", "ok", "--kind", "exited"), 0),
    Verb(("prune",), 0), Verb(("prune", "ok"), 0),
    Verb(("status", "-w", "--every", "0"), 2), Verb(("status", "-w", "--every", "-1"), 2), Verb(("logs", "ok", "-n", "0"), 2),
    Verb(("events", "ok", "--kind", "nope"), 2), Verb(("logs", "ok", "--since", "soon"), 2), Verb(("frobnicate",), 2),
    Verb(("start", "{home}/typo.toml"), 65), Verb(("start", "{home}/gated.toml", "--set", "nope=1"), 65),
    *(Verb((verb, "nope"), 66) for verb in ("status", "stop", "restart", "rm", "prune", "logs", "events", "attempts", "report",
                                              "stack")),
    Verb(("stack", "ok"), 1),  # not running: one line, nothing dumped
    Verb(("probe", "{home}/no-such.log"), 66),
    Verb(("report", "ok", "--out", "/nonexistent/dir/r.png"), 74),
    Verb(("start", "{home}/gated.toml"), 75), Verb(("rm", "gated"), 75),
    Verb(("stop", "gated"), 0), Verb(("rm", "ok"), 0),
]


@pytest.mark.timeout(360)  # 45 CLI processes, one after another: under a minute alone, three on 2 shared vCPUs
def test_every_verb_exits_with_the_readme_code(daemon: DaemonProcess, daemon_env: dict[str, str], make_job,
                                               home: Path) -> None:
    client = daemon.client()
    for name, script, extra in (("ok", "print('hi')\n", ""),
                                ("bad", "raise SystemExit(3)\n", "[restart]\nmax_attempts = 1\n")):
        client.start(str(make_job(name, script, extra=extra)), {})
        wait_until(lambda name=name: job_state(client, name) in ("done", "failed"))
    (home / "gated.toml").write_text(make_job("gated", GATED_JOB, params=f', "{home}/gate"').read_text())
    client.start(str(home / "gated.toml"), {})
    wait_until(lambda: job_state(client, "gated") == "running")
    (home / "typo.toml").write_text('comand = ["true"]\n')
    readme = _readme_exit_codes()
    for verb in VERBS:
        argv = [a.replace("{home}", str(home)) for a in verb.argv]
        result = supervise(daemon_env, *argv, check=False)
        assert result.returncode == verb.code, (argv, result.returncode, result.stderr)
        assert verb.code in readme, verb
        if verb.code == 2:  # argparse: the usage, then one line saying what is wrong
            assert "Traceback" not in result.stderr and "error: " in result.stderr.strip().splitlines()[-1], argv
        elif verb.code > 2:  # one line, no traceback (`probe` names itself: "supervise probe: ...")
            assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, (argv, result.stderr)
            assert result.stderr.startswith("supervise"), (argv, result.stderr)
    assert daemon.proc is not None and daemon.proc.poll() is None
