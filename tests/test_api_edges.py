"""The control API against slow, abusive or malformed clients: a real daemon, real sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import supervise

from supervisor.cli.client import Client
from supervisor.core.events import Event, EventKind
from supervisor.store.database import Store


@pytest.fixture
def quick_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    """A daemon that gives a client 1 s to send its request."""
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    d = DaemonProcess(home, {**daemon_env, "SUPERVISE_REQUEST_TIMEOUT_S": "1"})
    d.start()
    yield d
    d.close()


def _raw(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_clients_that_never_finish_a_request_are_closed_and_ping_still_answers(quick_daemon: DaemonProcess) -> None:
    half_headers = [_raw(quick_daemon.paths.socket) for _ in range(50)]
    half_body = [_raw(quick_daemon.paths.socket) for _ in range(20)]
    try:
        for sock in half_headers:
            sock.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for sock in half_body:
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"spec_")
        client = Client(quick_daemon.paths, timeout_s=5)
        try:
            assert client.ping().pid > 0  # answered while they all hang
        finally:
            client.close()
        started = time.monotonic()
        open_socks = half_headers + half_body
        wait_until(lambda: all(_closed_by_peer(s) for s in open_socks), timeout=10)
        assert time.monotonic() - started < 8
    finally:
        for sock in half_headers + half_body:
            sock.close()


def _http(daemon: DaemonProcess) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket)), base_url="http://supervise",
                        timeout=10)


BAD_REQUESTS = [
    ("GET", "/v1/jobs/j/events?attempt=1e23", None),
    ("GET", "/v1/jobs/j/events?attempt=100000000000000000000000", None),
    ("GET", "/v1/jobs/j/events?attempt=-1", None),
    ("GET", "/v1/jobs/j/events?after=x", None),
    ("GET", "/v1/jobs/j/events?after=99999999999999999999999", None),
    ("GET", "/v1/jobs/j/events?min_attempt=1e23", None),
    ("GET", "/v1/jobs/j/events?limit=0", None),
    ("GET", "/v1/jobs/j/log?offset=-5", None),
    ("GET", "/v1/jobs/j/log?offset=abc", None),
    ("GET", "/v1/jobs/j/log?offset=1e23", None),
    ("GET", "/v1/jobs/j/log?attempt=99999999999999999999999", None),
    ("GET", "/v1/jobs/a%00b/events", None),
    ("GET", "/v1/jobs/a%00b/attempts", None),
    ("GET", "/v1/jobs/a%00b/log", None),
    ("GET", "/v1/jobs/a%00b/gpu", None),
    ("GET", "/v1/status?job=a%00b", None),
    ("POST", "/v1/jobs", {"spec_path": "/tmp/a\u0000b.toml"}),
    ("GET", "/v1/gpus?host=ssh://nobody@never-used.invalid", None),
]


@pytest.mark.parametrize(("method", "url", "body"), BAD_REQUESTS)
def test_bad_values_get_400_with_one_line(daemon: DaemonProcess, make_job, method: str, url: str,
                                          body: dict[str, str] | None) -> None:
    client = daemon.client()
    client.start(str(make_job("j", "print('hi')\n")), {})
    with _http(daemon) as http:
        response = http.request(method, url, content=json.dumps(body) if body else None)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error and "\n" not in error and len(error) < 300
        assert http.get("/v1/ping").status_code == 200


def test_gpus_for_unknown_hosts_hold_no_host_slots(daemon: DaemonProcess) -> None:
    with _http(daemon) as http:
        for i in range(5):
            http.get(f"/v1/gpus?host=ssh://u@box{i}.invalid")
        assert http.get("/v1/ping").status_code == 200
    # No slot was made: no sampler started for any of them (a sampler says when it cannot sample).
    time.sleep(0.5)  # a sampler, had one been started, logs at once; nothing to poll for when none is
    assert "box" not in daemon.log_text()


def test_events_json_lists_every_stored_event_past_one_page(daemon: DaemonProcess, daemon_env: dict[str, str]) -> None:
    store = Store(daemon.paths.db)
    store.upsert_job("many", {"name": "many", "command": ["true"]}, "done")
    total = 10_000 + 1234  # one page is 10,000
    store.record_events(Event(job="many", attempt=1, kind=EventKind.INFO, message=f"line {i}") for i in range(total))
    store.close()
    result = supervise(daemon_env, "events", "many", "--json")
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line)["message"] for line in result.stdout.splitlines()]
    assert messages == [f"line {i}" for i in range(total)]
    # A follower's backlog too holds all of them before it waits for new ones.
    followed = daemon.client().follow_events("many", until_done=True)
    assert sum(1 for _ in followed) == total


TERM_IGNORING_JOB = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('up', flush=True)
while True:
    time.sleep(1)
"""

BAD_GRACES = ["1e12", "1e308", "NaN", "Infinity", "-Infinity", "-1", "86400.5", '"soon"']


def test_request_numbers_are_bounded_and_a_huge_grace_never_hangs_stop(daemon: DaemonProcess, make_job,
                                                                       daemon_env: dict[str, str]) -> None:
    """A grace of 1e12 s once made `stop` wait for ever on a job that ignores SIGTERM."""
    client = daemon.client()
    client.start(str(make_job("deaf", TERM_IGNORING_JOB)), {})
    wait_until(lambda: "up" in Path(client.status("deaf").jobs[0].attempt.log_path).read_text())
    with _http(daemon) as http:  # 10 s timeout: a stop that waits on the grace fails here
        for route in ("stop", "restart"):
            for grace in BAD_GRACES:
                response = http.post(f"/v1/jobs/deaf/{route}", content=f'{{"grace_s": {grace}}}')
                assert response.status_code == 400, (route, grace, response.text)
                error = response.json()["error"]
                assert "grace_s" in error and "\n" not in error and len(error) < 200, error
        assert http.get("/v1/ping").status_code == 200
    assert client.status("deaf").jobs[0].state == "running"  # nothing was stopped by a refused request
    for grace in ("1e12", "nan", "inf", "-1"):
        result = supervise(daemon_env, "stop", "deaf", "--grace", grace, check=False)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 2, result.stderr  # usage + one line
        assert "--grace" in result.stderr
    assert client.stop("deaf", grace_s=0.2).processes  # a bounded grace still stops it
