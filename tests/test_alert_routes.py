"""Alerts routed by severity and kind: `failure,gpu_fault=URL` gets only those, an unrouted URL gets
every alert; a route naming something that is neither is refused at load in one line, its URL
never shown.  Deliveries go to a real local HTTP endpoint as apprise JSON."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import wait_until

from supervisor.core.alert_routes import AlertKind, parse_route
from supervisor.core.config import Paths, load_settings
from supervisor.core.errors import ConfigError
from supervisor.notify.alerts import Alert, Alerter, shown_route


class PathSink(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str]]] = []  # (path, title)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        type(self).received.append((self.path, body["title"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def sink() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), PathSink)
    PathSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def _alert(kind: AlertKind, job: str) -> Alert:
    return Alert(kind=kind, job=job, attempt=1, title=f"{job}: {kind.value}", what=kind.value, evidence="e", gpu="",
                 next_action="n", key=f"{job}:{kind.value}")


def test_each_url_gets_the_alerts_its_route_names_and_an_unrouted_one_gets_all(sink: int) -> None:
    urls = [f"json://127.0.0.1:{sink}/everything",
            f"failure,gpu_fault=json://127.0.0.1:{sink}/pager",
            f" done = json://127.0.0.1:{sink}/done-only?x=1"]

    async def go() -> None:
        alerter = Alerter(urls, min_interval_s=0)
        for kind, job in ((AlertKind.DONE, "a"), (AlertKind.VERDICT, "b"), (AlertKind.WARNING, "c"),
                          (AlertKind.GPU_FAULT, "d")):
            assert await alerter.send(_alert(kind, job))
        assert await alerter.drain(10)
        await alerter.close()

    asyncio.run(go())
    wait_until(lambda: len(PathSink.received) == 7)
    by_path: dict[str, list[str]] = {}
    for path, title in PathSink.received:
        by_path.setdefault(path.split("?")[0], []).append(title)
    assert sorted(by_path["/everything"]) == ["a: done", "b: verdict", "c: warning", "d: gpu_fault"]
    assert sorted(by_path["/pager"]) == ["b: verdict", "d: gpu_fault"]  # failure severity, or named
    assert by_path["/done-only"] == ["a: done"]


def test_routes_parse_and_show_without_their_secrets() -> None:
    assert parse_route("warning,failure=tgram://123:secret-token/456") == (
        frozenset({"warning", "failure"}), "tgram://123:secret-token/456")
    # An '=' inside a URL (a query) is not a route.
    assert parse_route("json://box/alert?token=abc") == (frozenset(), "json://box/alert?token=abc")
    assert parse_route("mailto://user:pw@example.org?to=ops@example.org") == (
        frozenset(), "mailto://user:pw@example.org?to=ops@example.org")
    shown = shown_route("failure=tgram://123:secret-token/456")
    assert shown.startswith("failure=tgram://") and "secret-token" not in shown
    with pytest.raises(ValueError, match=r"alert route 'pager' is neither a severity \(failure, warning"):
        parse_route("pager=ntfy://ntfy.sh/topic")


def test_a_bad_route_is_refused_at_load_in_one_line_without_the_url(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('alert_urls = ["pager=tgram://123:secret-token/456"]\n')
    with pytest.raises(ConfigError) as info:
        load_settings(Paths(tmp_path), {})
    message = str(info.value)
    assert "\n" not in message and "alert route 'pager'" in message and "secret-token" not in message, message
    with pytest.raises(ConfigError) as info:
        load_settings(Paths(tmp_path / "elsewhere"), {"SUPERVISE_ALERT_URLS": "json://ok/x nope,failure=ntfy://t/x"})
    assert "alert route 'nope'" in str(info.value) and "\n" not in str(info.value)
