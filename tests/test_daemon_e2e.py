"""End to end through a real daemon process: real jobs, real store, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
from conftest import DaemonProcess, wait_until
from e2e_jobs import (
    CR_BAR_JOB,
    CRASHING_JOB,
    PROGRESS_JOB,
    check_redraw_read_while_it_waits,
    escaping_job,
    job_state,
    probe_events,
    progress_done,
    supervise,
)

from supervisor.cli.watch import plain_lines


def test_start_status_logs_and_done(daemon: DaemonProcess, make_job, daemon_env) -> None:
    spec = make_job("progress", PROGRESS_JOB, params=', "10", "0.01"')
    out = supervise(daemon_env, "start", str(spec))
    assert "started progress attempt 1" in out.stdout
    client = daemon.client()
    wait_until(lambda: job_state(client, "progress") == "done")
    attempt = client.attempts("progress").attempts[0]
    assert attempt.exit_code == 0 and attempt.verdict == "done"
    logs = supervise(daemon_env, "logs", "progress").stdout
    assert "10/10 [00:00<00:01, 5.0it/s]" in logs and "all good" in logs
    progress = [e for e in client.events("progress").events if e.kind == "progress"]
    assert [e.data["done"] for e in progress][-1] == 10
    status = supervise(daemon_env, "status", "--json").stdout
    assert json.loads(status)["jobs"][0]["state"] == "done"


def test_a_spec_naming_no_packs_is_read_as_probe_reads_its_log(daemon: DaemonProcess, make_job, daemon_env) -> None:
    """A spec without `probes` is read by every pack found, as `supervise probe` reads its log
    afterwards: the live events are the offline ones (it was the python pack alone: no progress)."""
    spec = make_job("plain", PROGRESS_JOB, params=', "6", "0.01"', probes=None)
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "plain") == "done")
    events = client.events("plain").events
    log = client.attempts("plain").attempts[0].log_path
    offline = json.loads(supervise(daemon_env, "probe", log, "--json").stdout)
    bars = [(e.probe, e.data["done"], e.data["total"]) for e in events if e.kind == "progress"]
    assert bars == [("transformers.checkpoint_shards", n, 6) for n in range(1, 7)]
    assert [(b["probe"], b["done"], b["total"]) for b in offline["progress"]] == [bars[-1]]
    assert client.attempts("plain").attempts[0].phase == offline["last_phase"] == "running"


def test_start_follow_exits_with_job_result(daemon: DaemonProcess, make_job, daemon_env) -> None:
    spec = make_job("crashy", CRASHING_JOB,
                    extra="[restart]\nmax_attempts = 1\n")
    result = supervise(daemon_env, "start", str(spec), "--follow", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "KeyError: 'layers.0.weight_scale'" in result.stdout
    assert "crashy failed" in result.stdout


def test_status_says_which_verdict_comes_next_and_when(daemon: DaemonProcess, make_job, daemon_env, home: Path) -> None:
    gate = home / "gate"  # the job holds at 5/10 until the gate exists
    spec = make_job("held", PROGRESS_JOB, params=f', "10", "0.01", "{gate}"', extra="[health]\nstall_floor_s = 30\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "held") >= 5)
    upcoming = client.status("held").jobs[0].next_verdict
    assert upcoming is not None and upcoming.verdict == "stalled"
    assert 25 < upcoming.in_s <= 30
    assert upcoming.reason.startswith("checkpoint_shard 5/10, no progress for 30.0s (bound 30.0s = stall_floor_s")
    text = supervise(daemon_env, "status", "held").stdout
    assert "  stalled in " in text and "if nothing changes: checkpoint_shard 5/10" in text
    gate.write_text("")
    wait_until(lambda: job_state(client, "held") == "done")
    assert client.status("held").jobs[0].next_verdict is None


def test_an_unterminated_tqdm_redraw_is_read_while_it_waits(daemon: DaemonProcess, make_job, home: Path) -> None:
    gate = home / "never"  # the bar stays at 4/8: its "4/8" redraw is never terminated
    spec = make_job("crbar", CR_BAR_JOB, params=f', "{gate}"',
                    extra="[health]\nstall_floor_s = 2.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    check_redraw_read_while_it_waits(client, "crbar", seen_within_s=10)


def test_stop_kills_escaped_grandchild(daemon: DaemonProcess, make_job, home: Path) -> None:
    pid_file = home / "grandchild.pid"
    script = escaping_job(pid_file)
    spec = make_job("escaper", script)
    client = daemon.client()
    client.start(str(spec), {})
    grandchild = int(wait_until(lambda: pid_file.exists() and pid_file.read_text()))
    gc = psutil.Process(grandchild)
    assert os.getpgid(grandchild) != client.status("escaper").jobs[0].attempt.pid  # really escaped
    response = client.stop("escaper", grace_s=1.0)
    assert grandchild in {p.pid for p in response.processes if p.reparented}
    assert not gc.is_running() or gc.status() == psutil.STATUS_ZOMBIE
    assert job_state(client, "escaper") == "stopped"
    attempt = client.attempts("escaper").attempts[0]
    # The wrapper is spared SIGTERM so it can record how the command ended.
    assert attempt.exit_signal == signal.SIGTERM, attempt
    assert attempt.action == "stopped by user" and attempt.state == "stopped" and attempt.verdict is None
    assert "killed by signal 15" in (attempt.reason or "")


def test_daemon_sigkill_and_restart_readopts_without_loss_or_doubles(
        daemon: DaemonProcess, make_job, home: Path) -> None:
    # 8 s of work, killed at 0.8 s: a restarted daemon must find it still running, even on a busy machine
    # (a daemon's start has taken 3.5 s on 2 cores under a load of 24).
    spec = make_job("steady", PROGRESS_JOB, params=', "80", "0.1"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: any(e.kind == "progress" and e.data.get("done", 0) >= 8 for e in client.events("steady").events))
    job_pid = client.status("steady").jobs[0].attempt.pid
    daemon.kill(signal.SIGKILL)
    assert psutil.pid_exists(job_pid)  # the job keeps running without its daemon
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "steady") == "done", timeout=30)
    interrupted = probe_events(client, "steady")

    spec2 = make_job("steady2", PROGRESS_JOB, params=', "80", "0.1"')
    client.start(str(spec2), {})
    wait_until(lambda: job_state(client, "steady2") == "done", timeout=30)
    uninterrupted = probe_events(client, "steady2")
    assert interrupted == uninterrupted
    assert [d for _, _, d in interrupted if d is not None] == list(range(1, 81))
    attempts = client.attempts("steady").attempts
    assert len(attempts) == 1 and attempts[0].pid == job_pid  # re-adopted, not relaunched
    assert "re-adopted" in daemon.log_text()



def test_cr_only_progress_is_read(daemon: DaemonProcess, make_job) -> None:
    script = """\
    import sys, time
    for i in range(1, 6):
        sys.stdout.write(f"\\rProcessing: {i*20}%|###| {i}/5 [00:01<00:00, 4.00it/s]")
        sys.stdout.flush()
        time.sleep(0.02)
    sys.stdout.write("\\n")
    """
    spec = make_job("crbar", script)
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "crbar") == "done")
    done = [e.data.get("done") for e in client.events("crbar").events if e.kind == "progress"]
    assert done and done[-1] == 5


def test_huge_line_and_binary_garbage_do_not_hurt_the_daemon(daemon: DaemonProcess, make_job) -> None:
    script = """\
    import sys
    out = sys.stdout.buffer
    out.write(b"\\xff\\xfe\\x00garbage\\x80 line\\n")
    chunk = b"a" * (1 << 20)
    for _ in range(50):
        out.write(chunk)
    out.write(b"\\nTraceback (most recent call last):\\n  File \\"x.py\\", line 1, in <module>\\nValueError: after the big line\\n")
    out.flush()
    sys.exit(3)
    """
    spec = make_job("garbage", script, extra="[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "garbage") == "failed", timeout=60)
    attempt = client.attempts("garbage").attempts[0]
    assert attempt.failure is not None and attempt.failure.kind == "value_error"
    assert client.ping().pid == daemon.proc.pid  # still the same daemon


def test_bad_spec_is_one_clear_line_and_nothing_runs(daemon_env, home: Path) -> None:
    spec = home / "bad.toml"
    spec.write_text('name = "bad"\ncommand = "not-a-list"\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.toml" in lines[0] and "command" in lines[0]
    assert not (home / "supervise.db").exists()  # not even a daemon was needed


def test_set_value_is_one_argv_item_never_a_command(daemon: DaemonProcess, make_job, home: Path, daemon_env) -> None:
    marker = home / "pwned"
    argv_file = home / "argv.json"
    script = f"""\
    import json, sys
    json.dump(sys.argv[1:], open("{argv_file}", "w"))
    """
    spec = make_job("inject", script, params=', "--out", "{out}"', extra='[params]\nout = "x"\n')
    evil = f"; touch {marker}; rm -rf / #"
    supervise(daemon_env, "start", str(spec), "--set", f"out={evil}")
    client = daemon.client()
    wait_until(lambda: job_state(client, "inject") == "done")
    assert json.loads(argv_file.read_text()) == ["--out", evil]
    assert not marker.exists()


def test_unknown_set_key_and_unknown_job_are_clear_errors(daemon_env, make_job) -> None:
    spec = make_job("plain", "print('hi')\n")
    result = supervise(daemon_env, "start", str(spec), "--set", "nope=1", check=False)
    assert result.returncode == 65 and "no such parameter" in result.stderr
    result = supervise(daemon_env, "start", "no-such-job-anywhere", check=False)
    assert result.returncode == 65 and "no job spec" in result.stderr


def test_openapi_schema_lists_routes_and_socket_is_private(daemon: DaemonProcess) -> None:
    import httpx

    transport = httpx.HTTPTransport(uds=str(daemon.paths.socket))
    with httpx.Client(transport=transport, base_url="http://supervise") as http:
        schema = http.get("/openapi.json").json()
    assert "/v1/jobs/{name}/stop" in schema["paths"]
    assert "StartRequest" in schema["components"]["schemas"]
    mode = os.stat(daemon.paths.socket).st_mode & 0o777
    assert mode == 0o600
    state_like = list(_state_like_fields(schema))
    # The fields a client branches on: each lists its values, so none is a free string.
    assert {"JobStatus.state", "AttemptInfo.state", "AttemptInfo.verdict", "AttemptInfo.phase", "NextVerdict.verdict",
            "EventInfo.kind", "EventInfo.phase"} <= {name for name, _ in state_like}
    assert [name for name, values in state_like if not values] == []
    assert dict(state_like)["JobStatus.state"] == ["starting", "waiting", "running", "unreachable", "backoff", "done",
                                                   "failed", "stopped", "cancelled"]


_STATE_LIKE = ("state", "verdict", "phase", "kind")


def _state_like_fields(schema: dict) -> Iterator[tuple[str, list[str]]]:
    """(Model.field, the values its schema allows) for every state-like field of every model."""
    models = schema["components"]["schemas"]

    def values(node: dict) -> list[str]:
        if "$ref" in node:
            return values(models[node["$ref"].rsplit("/", 1)[1]])
        found = list(node.get("enum", []))
        for option in node.get("anyOf", []) + node.get("allOf", []):
            found += values(option)
        return found

    for model, body in models.items():
        for field, node in body.get("properties", {}).items():
            if field in _STATE_LIKE or field.endswith("_state"):
                yield f"{model}.{field}", values(node)


# argv: the attempt number, a gate file.  Attempts 1 to 3 crash at once; attempt 4 crashes once the
# gate exists.
_CRASH_UNTIL_GATE_JOB = """\
import os, sys, time
n, gate = int(sys.argv[1]), sys.argv[2]
print(f"attempt {n}", flush=True)
while n == 4 and not os.path.exists(gate):
    time.sleep(0.01)
raise RuntimeError(f"failure number {n}")
"""


def test_attempts_count_within_their_run_everywhere(daemon: DaemonProcess, make_job, daemon_env, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("runs", _CRASH_UNTIL_GATE_JOB, params=f', "{{attempt}}", "{gate}"',
                    extra="[restart]\nmax_attempts = 2\nbackoff_initial_s = 0.1\nbackoff_jitter_s = 0\n"
                          "stop_on_repeat = false\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "runs") == "failed")  # run 1: attempts 1 and 2
    client.start(str(spec), {})  # run 2: attempt 3 crashes, attempt 4 is relaunched and holds
    wait_until(lambda: (a := client.status("runs").jobs[0].attempt) is not None and a.n == 4 and a.state == "running")
    attempts = client.attempts("runs").attempts
    assert [(a.n, a.run, a.run_attempt) for a in attempts] == [(1, 1, 1), (2, 1, 2), (3, 2, 1), (4, 2, 2)]

    def shown_everywhere() -> None:
        assert "  attempt 2/2 (#4)  pid " in supervise(daemon_env, "status", "runs").stdout
        assert "running    attempt 2/2 (#4)  " in supervise(daemon_env, "jobs").stdout
        assert "  runs  running  attempt 2/2 (#4)  " in plain_lines(client.status())[0]  # `status -w`, piped
        page = home / "runs.html"
        supervise(daemon_env, "report", "runs", "--out", str(page))
        cells = re.findall(r"<tr><td>#\d+</td><td>([^<]*)</td>", page.read_text())
        assert cells == ["1/2", "2/2", "1/2 (#3)", "2/2 (#4)"]

    shown_everywhere()
    # A restarted daemon re-adopts attempt 4 in its run: the same count, and no third attempt in it.
    daemon.kill(signal.SIGKILL)
    daemon.start()
    client = daemon.client()
    wait_until(lambda: "re-adopted" in daemon.log_text())
    shown_everywhere()
    gate.write_text("")
    wait_until(lambda: job_state(client, "runs") == "failed")
    assert [a.n for a in client.attempts("runs").attempts] == [1, 2, 3, 4]
    assert "attempt 2/2 (#4)" in supervise(daemon_env, "jobs").stdout
