"""Alerts through apprise to a real local HTTP endpoint; de-duplication; URL redaction."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import structlog
from aiohttp import web

from supervisor.core.alert_routes import AlertKind
from supervisor.core.redact import redact_text, redact_url
from supervisor.notify.alerts import Alert, Alerter, format_body


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def alert(key: str = "extract:2:stalled", attempt: int = 2) -> Alert:
    return Alert(
        job="extract",
        attempt=attempt,
        title="extract attempt 2 stalled",
        what="stalled: shard 45/64, no progress for 3m10s (bound 52.8s = 3 x median 17.6 s/it)",
        evidence="probe vllm.shards, done 45/64\nlast line: Loading safetensors checkpoint shards:  70% | 45/64",
        gpu="GPU 0: 29640/143771 MiB, GPU 1: 29012/143771 MiB",
        next_action="kill the process group, wait for GPU release, relaunch in 20s (attempt 3/3)",
        key=key,
    )


async def with_endpoint(body: Callable[[int, list[dict[str, Any]]], Awaitable[None]]) -> list[dict[str, Any]]:
    """Run ``body(port, received)`` with a JSON-accepting HTTP server on 127.0.0.1."""
    received: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append({"path": request.path, "auth": request.headers.get("Authorization"),
                         "json": await request.json()})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        await body(port, received)
    finally:
        await runner.cleanup()
    return received


def dead_port() -> int:
    # A port that was just free: nothing listens there, so connecting is refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_alert_reaches_a_real_http_endpoint() -> None:
    results: list[bool] = []

    async def body(port: int, received: list[dict[str, Any]]) -> None:
        alerter = Alerter([f"json://ops:hunter2@127.0.0.1:{port}/hooks/supervise"])
        results.append(await alerter.send(alert()))
        assert await alerter.drain(10)

    received = asyncio.run(with_endpoint(body))
    assert results == [True]
    assert len(received) == 1
    post = received[0]
    assert post["path"] == "/hooks/supervise"
    assert post["auth"].startswith("Basic ")
    payload = post["json"]
    assert payload["title"] == "extract attempt 2 stalled"
    message = payload["message"]
    assert "job: extract, attempt 2" in message
    assert "shard 45/64, no progress for 3m10s" in message
    assert "  probe vllm.shards, done 45/64" in message
    assert "GPU: GPU 0: 29640/143771 MiB, GPU 1: 29012/143771 MiB" in message
    assert "severity: failure" in message and payload["type"] == "failure"
    assert "next: kill the process group, wait for GPU release, relaunch in 20s (attempt 3/3)" in message


def test_same_key_is_suppressed_within_the_interval_and_counted() -> None:
    clock = Clock()
    results: list[bool] = []

    async def body(port: int, received: list[dict[str, Any]]) -> None:
        alerter = Alerter([f"json://127.0.0.1:{port}/a"], min_interval_s=60, clock=clock)
        results.append(await alerter.send(alert()))
        clock.t += 10
        results.append(await alerter.send(alert()))
        results.append(await alerter.send(alert()))
        results.append(await alerter.send(alert(key="other")))  # a different incident goes out
        clock.t += 60
        results.append(await alerter.send(alert()))
        assert alerter.suppressed_total == 2
        assert await alerter.drain(10)

    received = asyncio.run(with_endpoint(body))
    assert results == [True, False, False, True, True]
    assert len(received) == 3
    assert "(2 similar alert(s) suppressed since the last one)" in received[2]["json"]["message"]
    assert "suppressed" not in received[0]["json"]["message"]


def test_a_burst_of_distinct_alerts_is_capped() -> None:
    clock = Clock()
    results: list[bool] = []

    async def body(port: int, received: list[dict[str, Any]]) -> None:
        alerter = Alerter([f"json://127.0.0.1:{port}/a"], min_interval_s=60, max_burst=3, clock=clock)
        for i in range(5):
            results.append(await alerter.send(alert(key=f"k{i}")))
        clock.t += 60
        results.append(await alerter.send(alert(key="k9")))
        assert await alerter.drain(10)

    received = asyncio.run(with_endpoint(body))
    assert results == [True, True, True, False, False, True]
    assert len(received) == 4


def test_no_urls_logs_and_returns_false() -> None:
    with structlog.testing.capture_logs() as logs:
        assert asyncio.run(Alerter([]).send(alert())) is False
    assert any(e["event"] == "alert" and e["job"] == "extract" for e in logs)


def test_dead_endpoint_is_counted_failed_without_raising_and_hides_the_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"json://ops:hunter2@127.0.0.1:{dead_port()}/hook?token=abc123"
    caplog.set_level(logging.DEBUG)

    async def body() -> Alerter:
        alerter = Alerter([url], timeout_s=10)
        assert await alerter.send(alert()) is True  # on its way: delivery is the alerter's own task
        assert await alerter.drain(20)
        return alerter

    with structlog.testing.capture_logs() as logs:
        alerter = asyncio.run(body())
    assert alerter.counts().failed == 1
    failures = [e for e in logs if e["event"] == "alert delivery failed"]
    assert len(failures) == 1
    assert failures[0]["urls"] == [redact_url(url)]
    everything = repr(logs) + caplog.text
    assert "hunter2" not in everything and "abc123" not in everything


def test_a_url_apprise_cannot_parse_is_logged_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        alerter = Alerter(["nosuchservice://admin:hunter2@example.com/x"])
        assert asyncio.run(alerter.send(alert())) is False
    assert alerter.urls == ["nosuchservice://example.com/***"]
    assert "hunter2" not in repr(logs) + caplog.text


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("json://user:s3cret@127.0.0.1:8080/path?token=abc&x=1", "json://127.0.0.1/***"),
        ("mailto://me:hunter2@gmail.com?to=ops@example.com", "mailto://gmail.com/***"),
        ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX", "https://hooks.slack.com/***"),
        ("https://discord.com/api/webhooks/1234567890/abcdefTOKEN123456789", "https://discord.com/***"),
        ("https://api.telegram.org/bot123456:ABCdef/sendMessage", "https://api.telegram.org/***"),
        ("tgram://123456789:AAHbcdefghijklmnop/12345", "tgram://***"),
        ("discord://1234567890/abcdefTOKEN", "discord://***"),
        ("slack://TokenA/TokenB/TokenC/#ops", "slack://***"),
        ("gotify://push.example.com/AbCdEf1234567890xyz", "gotify://push.example.com/***"),
        ("https://example.com/hook?api_key=k&sig=s&name=ops", "https://example.com/***"),
        ("json://127.0.0.1:9000/alerts", "json://127.0.0.1/***"),
        ("json://localhost", "json://localhost"),
        ("json://[::1]:9000/x", "json://[::1]/***"),
        ("pbul://o.gn5kj6nfhv736I7jC3cj3QLRiyhgl98b", "pbul://***"),  # a key that looks like a dotted name
        ("prowl://notahost", "prowl://***"),
        ("failure,gpu_fault=ntfy://ntfy.sh/topic", "failure,gpu_fault=ntfy://***"),
        ("not a url", "***"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_redact_text_masks_every_url() -> None:
    text = "Unparseable URL json://a:pw@host/d and tgram://bot:tok/chat"
    assert redact_text(text) == "Unparseable URL json://*** and tgram://***"


def test_body_without_evidence_or_gpu() -> None:
    a = Alert("j", 1, "t", "crashed", "", "", "give up", "k")
    assert format_body(a) == ("job: j, attempt 1\nseverity: failure\nwhat: crashed\nevidence:\n  (none)\nGPU: unknown\n"
                              "next: give up")


@pytest.mark.parametrize(("kind", "severity"), [
    (AlertKind.VERDICT, "failure"), (AlertKind.GAVE_UP, "failure"), (AlertKind.WARNING, "warning"),
    (AlertKind.SLOW, "warning"), (AlertKind.DONE, "success"), (AlertKind.RECOVERED, "success"),
    (AlertKind.PHASE, "info"), (AlertKind.ETA, "info"),
])
def test_each_kind_goes_out_with_a_severity_receivers_can_route_on(kind: AlertKind, severity: str) -> None:
    async def body(port: int, received: list[dict[str, Any]]) -> None:
        alerter = Alerter([f"json://127.0.0.1:{port}/a"])
        a = alert()
        assert await alerter.send(Alert(a.job, a.attempt, a.title, a.what, a.evidence, a.gpu, a.next_action,
                                        a.key, kind))
        assert await alerter.drain(10)

    [post] = asyncio.run(with_endpoint(body))
    assert post["json"]["type"] == severity  # apprise's notify type, as the receiver sees it


def test_a_hanging_endpoint_never_holds_send_and_a_full_queue_drops_the_oldest() -> None:
    async def body() -> None:
        accepted = asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            accepted.set()
            await asyncio.sleep(3600)  # accepts, never answers
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        alerter = Alerter([f"json://127.0.0.1:{port}/a"], timeout_s=1, queue_limit=3, max_burst=100)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            for i in range(6):
                assert await alerter.send(alert(key=f"k{i}"))
            assert loop.time() - started < 0.5  # queued: no send waited on the endpoint
            # Six decided before the delivery task first ran: the queue kept the newest three.
            assert alerter.counts().dropped == 3
            await asyncio.wait_for(accepted.wait(), 10)
            assert await alerter.drain(30)
            assert alerter.counts().failed == 3  # each given up after its 1 s timeout
            await alerter.close(timeout_s=0.1)
        finally:
            await runner.cleanup()

    asyncio.run(body())


def test_a_verdict_alert_carries_the_first_frames_of_the_stacks_dumped_before_the_kill() -> None:
    from supervisor.core.events import Verdict
    from supervisor.notify import notices
    from supervisor.watchdog import Judgement

    at = notices.Attempt(job="j", n=2, gpu="", stacks="pid 7 (python job.py): frozen_here (job.py:5) < <module> (job.py:9)")
    alert = notices.verdict(at, Judgement(Verdict.STALLED, "shard 3/10, no progress for 1m00s"), "relaunch in 10s")
    assert "stacks: pid 7 (python job.py): frozen_here (job.py:5)" in alert.evidence


def test_the_daemon_log_takes_each_alert_at_its_own_severity() -> None:
    # A job that finished well is not a warning in the daemon's log: only failures and warnings are.
    import dataclasses

    sent = [dataclasses.replace(alert(key=f"k{kind.value}"), kind=kind)
            for kind in (AlertKind.VERDICT, AlertKind.WARNING, AlertKind.DONE, AlertKind.ETA)]
    with structlog.testing.capture_logs() as logs:
        for each in sent:
            asyncio.run(Alerter([], max_burst=10).send(each))
    levels = {e["severity"]: e["log_level"] for e in logs if e["event"] == "alert"}
    assert levels == {"failure": "error", "warning": "warning", "success": "info", "info": "info"}
