"""When no probe recognises why an attempt failed, the log's last lines are the evidence: the verdict's
reason and evidence, `status`, the alert and the web page (which shows the reason) all carry them.
Through a real daemon whose alerts reach a real local HTTP endpoint, with a real `python` refusing a
script that is not there."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import AlertSink, job_state, supervise


@pytest.fixture
def alerting(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()
        server.shutdown()
        server.server_close()


def _failed_job(client, home: Path, tmp_path: Path, name: str, command: list[str]):
    spec = home / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = {json.dumps(command)}\n'
                    f'workdir = {json.dumps(str(tmp_path))}\nprobes = ["python"]\n'
                    "[restart]\nmax_attempts = 1\n")
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, name) == "failed", timeout=60)
    attempt = client.attempts(name).attempts[0]
    return attempt, Path(attempt.log_path).read_text().strip().splitlines()[-1]


def _shown_everywhere(client, daemon_env: dict[str, str], name: str, attempt, last_line: str) -> None:
    # The verdict: its reason quotes the line (and so does the attempt's row the web page shows).
    assert attempt.verdict == "crashed" and last_line in (attempt.reason or ""), attempt.reason
    verdicts = client.events(name, kinds=["verdict"]).events
    assert verdicts and last_line in verdicts[-1].message, verdicts
    # `status`, through the CLI as a user reads it (exit 1: a failed job).
    status = supervise(daemon_env, "status", name, check=False).stdout
    assert last_line in status, status
    # The alert, as the endpoint received it.
    wait_until(lambda: any(last_line in a["message"] for a in AlertSink.received), timeout=30)


def test_python_on_a_missing_script_shows_pythons_last_line_in_verdict_status_and_alert(
        alerting: DaemonProcess, daemon_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    client = alerting.client()
    attempt, last_line = _failed_job(client, home, tmp_path, "missing", [sys.executable, "nonexistent.py"])
    assert "can't open file" in last_line and "nonexistent.py" in last_line, last_line  # python's own words
    _shown_everywhere(client, daemon_env, "missing", attempt, last_line)


def test_a_crash_no_probe_knows_shows_the_logs_last_lines_as_its_evidence(
        alerting: DaemonProcess, daemon_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    # A program's own words that no rule reads as a failure: the log's end is all the evidence there is.
    script = "print('checking /data/run7'); print('quota exceeded for /data/run7 (12.1 TB of 12 TB)'); exit(3)"
    client = alerting.client()
    attempt, last_line = _failed_job(client, home, tmp_path, "quota", [sys.executable, "-c", script])
    assert last_line == "quota exceeded for /data/run7 (12.1 TB of 12 TB)", last_line
    _shown_everywhere(client, daemon_env, "quota", attempt, last_line)
    verdict = client.events("quota", kinds=["verdict"]).events[-1]
    assert verdict.data["last_lines"] == ["checking /data/run7", last_line], verdict.data
    assert "no error line recognised" in verdict.message
