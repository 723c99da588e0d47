"""The verbs people expect of a service manager, end to end through a real daemon: restart, rm,
log retention (prune), daemon stop / restart (jobs keep running), config changes noticed,
`logs -n / --since`, `events --kind / -n / --since`, `status JOB` exiting 1 for a failed job."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from conftest import DaemonProcess, wait_until
from e2e_jobs import CRASHING_JOB, PROGRESS_JOB, job_state, progress_done, supervise

from supervisor.cli.client import Client
from supervisor.core.config import Paths

GATED_JOB = """\
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""
QUICK_JOB = "print('hello', flush=True)\n"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _attempts(env: dict[str, str], job: str) -> list[dict]:
    return json.loads(supervise(env, "attempts", job, "--json").stdout)["attempts"]


def test_restart_stops_and_starts_with_the_stored_overrides(daemon: DaemonProcess, daemon_env, make_job,
                                                            home: Path) -> None:
    gate = home / "gate"
    spec = make_job("gated", GATED_JOB, params=f', "{gate}", "{{word}}"', extra='[params]\nword = "plain"\n')
    supervise(daemon_env, "start", str(spec), "--set", "word=override")
    client = daemon.client()
    wait_until(lambda: job_state(client, "gated") == "running")
    first_pid = client.status("gated").jobs[0].attempt.pid
    out = supervise(daemon_env, "restart", "gated").stdout
    assert "stopped gated" in out and "started gated attempt 2" in out, out
    attempts = _attempts(daemon_env, "gated")
    assert [a["n"] for a in attempts] == [1, 2]
    assert attempts[0]["state"] == "stopped" and _gone(first_pid)
    assert attempts[1]["argv"][-1] == "override"  # the --set value given at start, not the spec's default
    gate.touch()
    wait_until(lambda: job_state(client, "gated") == "done")
    # Not running: restart just starts it.
    out = supervise(daemon_env, "restart", "gated").stdout
    assert "stopped" not in out and "started gated attempt 3" in out, out


def test_rm_refuses_a_running_job_then_forgets_it_keeping_its_logs(daemon: DaemonProcess, daemon_env, make_job,
                                                                   home: Path) -> None:
    gate = home / "gate"
    spec = make_job("gated", GATED_JOB, params=f', "{gate}"')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "gated") == "running")
    refused = supervise(daemon_env, "rm", "gated", check=False)
    assert refused.returncode == 75, refused.stderr
    assert refused.stderr.strip() == "supervise: job 'gated' is running; `supervise stop gated` first, then `supervise rm gated`"
    log_path = Path(client.status("gated").jobs[0].attempt.log_path)
    supervise(daemon_env, "stop", "gated")
    out = supervise(daemon_env, "rm", "gated").stdout
    assert "forgot gated (1 attempts); its logs stay in" in out, out
    assert log_path.is_file()
    assert json.loads(supervise(daemon_env, "jobs", "--json").stdout)["jobs"] == []
    assert supervise(daemon_env, "status", "gated", check=False).returncode == 66
    # Started again, it begins a fresh history; rm --logs deletes the files too.
    spec2 = make_job("quick", QUICK_JOB)
    supervise(daemon_env, "start", str(spec2))
    wait_until(lambda: job_state(client, "quick") == "done")
    quick_log = Path(client.status("quick").jobs[0].attempt.log_path)
    assert quick_log.is_file()
    supervise(daemon_env, "rm", "quick", "--logs")
    assert not quick_log.exists()


def _stop_daemon(env: dict[str, str]) -> None:
    out = supervise(env, "daemon", "stop").stdout
    assert "keep running" in out, out


def test_daemon_restart_keeps_jobs_reads_changed_config_and_prunes(daemon: DaemonProcess, daemon_env, make_job,
                                                                   home: Path) -> None:
    client = daemon.client()
    quick = make_job("quick", QUICK_JOB)
    logs = []
    for n in (1, 2, 3):
        supervise(daemon_env, "start", str(quick))
        wait_until(lambda n=n: job_state(client, "quick") == "done" and len(client.attempts("quick").attempts) == n)
        logs.append(Path(client.attempts("quick").attempts[-1].log_path))
    assert all(p.is_file() for p in logs)  # the default keeps 20
    gate = home / "gate"
    supervise(daemon_env, "start", str(make_job("gated", GATED_JOB, params=f', "{gate}"')))
    wait_until(lambda: job_state(client, "gated") == "running")
    job_pid = client.status("gated").jobs[0].attempt.pid

    shown = supervise(daemon_env, "config", "show").stdout
    assert "changed since the daemon started" not in shown
    (home / "config.toml").write_text("log_keep_attempts = 1\n")
    shown = supervise(daemon_env, "config", "show").stdout
    assert "the config file changed since the daemon started" in shown, shown
    assert json.loads(supervise(daemon_env, "config", "show", "--json").stdout)["changed_since_start"] is True

    old_pid = client.ping().pid
    try:
        out = supervise(daemon_env, "daemon", "restart").stdout
        assert "daemon running: pid" in out, out
        fresh = Client(Paths(home))
        assert fresh.ping().pid != old_pid and daemon.proc is not None and daemon.proc.poll() is not None
        status = fresh.status("gated").jobs[0]
        assert status.state == "running" and status.attempt.pid == job_pid  # re-adopted, not relaunched
        shown = supervise(daemon_env, "config", "show").stdout
        assert "changed since" not in shown and "log_keep_attempts" in shown
        out = supervise(daemon_env, "prune").stdout
        assert "removed 2 attempt logs" in out, out
        assert [p.is_file() for p in logs] == [False, False, True]
        gate.touch()
        wait_until(lambda: fresh.status("gated").jobs[0].state == "done")
        fresh.close()
    finally:
        _stop_daemon(daemon_env)
    assert not Client(Paths(home)).accepting()


def test_a_launch_prunes_old_logs_but_never_the_running_attempts(home: Path, daemon_env, make_job,
                                                                 monkeypatch) -> None:
    (home / "config.toml").write_text("log_keep_attempts = 1\nlog_max_bytes = 1\n")
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        gate = home / "gate"
        spec = make_job("gated", GATED_JOB, params=f', "{gate}"')
        first = client.start(str(spec), {})
        wait_until(lambda: job_state(client, "gated") == "running")
        # Over log_max_bytes already ("waiting\n"), yet it is the running attempt's: kept.
        wait_until(lambda: Path(first.log_path).stat().st_size > 1)
        assert supervise(daemon_env, "prune", "gated").stdout.startswith("supervise: removed 0 attempt logs")
        assert Path(first.log_path).is_file()
        gate.touch()
        wait_until(lambda: job_state(client, "gated") == "done")
        gate.unlink()
        second = client.start(str(spec), {})
        wait_until(lambda: not Path(first.log_path).exists(), timeout=10)  # pruned at the launch
        assert Path(second.log_path).is_file()
    finally:
        daemon.close()


def test_logs_and_events_take_n_since_and_kind(daemon: DaemonProcess, daemon_env, make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("progress", PROGRESS_JOB, params=f', "20", "0.01", "{gate}"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: progress_done(client, "progress") >= 10)
    time.sleep(0.05)  # the events so far are strictly before `since`
    since = dt.datetime.now().isoformat(sep=" ")
    time.sleep(0.05)
    gate.touch()
    wait_until(lambda: job_state(client, "progress") == "done")
    log_lines = Path(client.status("progress").jobs[0].attempt.log_path).read_text().splitlines()

    assert supervise(daemon_env, "logs", "progress", "-n", "3").stdout.splitlines() == log_lines[-3:]
    recent = supervise(daemon_env, "logs", "progress", "--since", since).stdout
    assert " 11/20 " in recent and "all good" in recent and " 10/20 " not in recent and " 5/20 " not in recent, recent
    assert supervise(daemon_env, "logs", "progress", "--since", "1h").stdout.splitlines() == log_lines
    later = (dt.datetime.now() + dt.timedelta(hours=1)).isoformat(sep=" ")
    assert supervise(daemon_env, "logs", "progress", "--since", later).stdout == ""
    # --grep: only the lines it matches; with -n the last N of those (grep | tail -n)
    matching = [line for line in log_lines if re.search(r" 1[0-9]/20 ", line)]
    assert len(matching) == 10
    assert supervise(daemon_env, "logs", "progress", "--grep", r" 1[0-9]/20 ").stdout.splitlines() == matching
    assert supervise(daemon_env, "logs", "progress", "--grep", r" 1[0-9]/20 ", "-n", "2").stdout.splitlines() == matching[-2:]
    assert supervise(daemon_env, "logs", "progress", "--grep", "no such line").stdout == ""
    for bad in ("(unclosed", "a" * 1001, "x{2,1}"):
        out = supervise(daemon_env, "logs", "progress", "--grep", bad, check=False)
        last = out.stderr.strip().splitlines()[-1]  # argparse's usage, then the one line that says what is wrong
        assert out.returncode == 2 and out.stdout == "" and last.startswith("supervise logs: error: argument --grep: ") \
            and "WARNING" not in out.stderr, \
            (bad[:20], out.returncode, out.stderr)
    # status: when a finished attempt ended and how long it ran (and no program pid once it ended)
    assert client.status("progress").jobs[0].program_pid is None
    shown = supervise(daemon_env, "status", "progress").stdout
    attempt = client.attempts("progress").attempts[-1]
    assert f"ended {dt.datetime.fromtimestamp(attempt.ended):%Y-%m-%d %H:%M:%S}  ran " in shown, shown

    kinds = [json.loads(line)["kind"] for line in
             supervise(daemon_env, "events", "progress", "--kind", "launched", "--kind", "exited", "--json").stdout.splitlines()]
    assert kinds == ["launched", "exited"]
    assert len(supervise(daemon_env, "events", "progress", "-n", "2", "--json").stdout.splitlines()) == 2
    after = [json.loads(line) for line in supervise(daemon_env, "events", "progress", "--since", since, "--json").stdout.splitlines()]
    assert after and all(e["ts"] >= dt.datetime.fromisoformat(since).timestamp() for e in after)
    assert len(after) < len(client.events("progress").events)


def test_status_of_a_failed_job_exits_1_and_json_is_unchanged(daemon: DaemonProcess, daemon_env, make_job) -> None:
    spec = make_job("crashy", CRASHING_JOB, extra="[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "crashy") == "failed")
    text = supervise(daemon_env, "status", "crashy", check=False)
    assert text.returncode == 1 and "crashy: failed" in text.stdout
    as_json = supervise(daemon_env, "status", "crashy", "--json", check=False)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == json.loads(client.status("crashy").model_dump_json()) | {
        "jobs": json.loads(as_json.stdout)["jobs"]}  # the API's own model, nothing added
    assert supervise(daemon_env, "status", check=False).returncode == 0  # all jobs: a listing, not a question


def test_status_shows_the_program_s_pid_beside_its_wrapper_s(daemon: DaemonProcess, daemon_env, make_job) -> None:
    client = daemon.client()
    client.start(str(make_job("napper", "import time\ndef napping_here():\n    time.sleep(60)\nnapping_here()\n")), {})
    wait_until(lambda: client.status("napper").jobs[0].program_pid is not None, timeout=20)
    job = client.status("napper").jobs[0]
    program, wrapper = job.program_pid, job.attempt.pid
    assert psutil.Process(program).ppid() == wrapper and "napper.py" in " ".join(psutil.Process(program).cmdline())
    assert f"pid {program} (wrapper {wrapper})" in supervise(daemon_env, "status", "napper").stdout
    client.stop("napper", 1.0)


def test_an_attempt_number_below_one_is_a_usage_error(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                      make_job: Callable[..., Path]) -> None:
    daemon.client().start(str(make_job("one", "print('done')\n")), {})
    wait_until(lambda: job_state(daemon.client(), "one") == "done")
    for verb in ("logs", "events"):
        for bad in ("-1", "0", "x", "99999999999"):
            out = supervise(daemon_env, verb, "one", "--attempt", bad, check=False)
            last = out.stderr.strip().splitlines()[-1]
            assert out.returncode == 2 and out.stdout == "" and last.startswith(f"supervise {verb}: error: argument "
                                                                                "--attempt: "), (verb, bad, out.stderr)
        assert supervise(daemon_env, verb, "one", "--attempt", "1").returncode == 0


def test_a_long_store_migration_is_said_in_the_daemon_log_and_by_the_waiting_cli(home: Path,
                                                                                 daemon_env: dict[str, str]) -> None:
    """An old store (schema 9) holding 300,000 progress rows: the daemon started by the first CLI
    call migrates it before it listens.  The CLI says why it waits; the daemon's log says each step."""
    import json as _json
    import sqlite3

    from supervisor.store.database import SCHEMA_VERSION
    from supervisor.store.schema import MIGRATIONS

    # From the version before the thinning migration (the long one); later ones run after it.
    before = next(i for i, m in enumerate(MIGRATIONS) if "DELETE FROM events WHERE id IN" in m)

    paths = Paths(home)
    db = sqlite3.connect(paths.db)
    for migration in MIGRATIONS[:before]:  # a store as that version left it (later tables and columns absent)
        db.executescript(migration)
    rows = ((f"job{n % 50}", 1, 1_000.0 + n, "progress", "tqdm.bar", f"{n}",
             _json.dumps({"done": n, "total": 300_000, "desc": f"bar{n % 7}"}), n) for n in range(300_000))
    db.executemany("INSERT INTO events(job, attempt, ts, kind, probe, message, data_json, log_offset) "
                   "VALUES(?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.execute(f"PRAGMA user_version={before}")
    db.commit()
    db.close()
    try:
        out = supervise(daemon_env, "status", check=False)
        assert out.returncode == 0, out.stderr
        said = [line for line in out.stderr.splitlines() if "migrating its store" in line]
        assert len(said) == 1 and f"from schema {before} to {SCHEMA_VERSION} (300,000 events)" in said[0], \
            out.stderr
        logged = paths.daemon_log.read_text()
        assert '"migrating the store"' in logged and '"events": 300000' in logged, logged[-2000:]
        assert '"store migration step done"' in logged and '"store migrated"' in logged, logged[-2000:]
        assert not (home / "supervise.db.migrating").exists()
    finally:
        _stop_daemon(daemon_env)
