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


def test_a_crash_no_probe_knows_shows_the_logs_last_line_in_verdict_status_and_alert(
        alerting: DaemonProcess, daemon_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    spec = home / "missing.toml"
    spec.write_text(f'name = "missing"\ncommand = {json.dumps([sys.executable, "nonexistent.py"])}\n'
                    f'workdir = {json.dumps(str(tmp_path))}\nprobes = ["python"]\n'
                    "[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "missing") == "failed", timeout=60)
    attempt = client.attempts("missing").attempts[0]
    last_line = Path(attempt.log_path).read_text().strip().splitlines()[-1]
    assert "can't open file" in last_line and "nonexistent.py" in last_line, last_line  # python's own words
    # The verdict: its reason names the line, its evidence holds the log's last lines.
    assert attempt.verdict == "crashed" and last_line in (attempt.reason or ""), attempt.reason
    verdicts = client.events("missing", kinds=["verdict"]).events
    assert verdicts and last_line in verdicts[-1].message, verdicts
    assert verdicts[-1].data["last_lines"][-1:] == [last_line], verdicts[-1].data
    # `status`, through the CLI as a user reads it.
    status = supervise(daemon_env, "status", "missing", check=False).stdout  # exit 1: a failed job
    assert last_line in status, status
    # The alert, as the endpoint received it.
    wait_until(lambda: any(last_line in a["message"] for a in AlertSink.received), timeout=30)
