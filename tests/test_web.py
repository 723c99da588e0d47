"""The web page in a real headless browser (Debian's chromium + chromium-driver, driven by selenium),
served by a real daemon running real jobs.  CI installs chromium (.ci/run): these tests never skip.

Screenshots for the README and docs/guides/web.md: `SUPERVISE_WEB_SHOTS=docs pytest tests/test_web.py -k stuck` saves the
overview and the job page of the stuck-load-then-relaunch run there.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import psutil
import pytest
from conftest import REPO, DaemonProcess, wait_until
from e2e_jobs import CRASHING_JOB, PROGRESS_JOB, supervise
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from supervisor.core import protocol
from supervisor.hosts.local import cgroup
from supervisor.hosts.local.cgroup import ContainmentKind

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

STALL_TSV = REPO / "tests" / "data" / "pacing" / "vllm-0.23-6.7b-serve-stall-at-5of13.arrivals.tsv"
REPLAY = REPO / "tests" / "jobs" / "replay.py"
SLEEPER = "import time\nprint('working', flush=True)\nwhile True:\n    time.sleep(0.1)\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Web:
    """The page as `supervise web` serves it for one daemon."""

    def __init__(self, daemon: DaemonProcess, port: int, read_only: bool = False) -> None:
        self.daemon = daemon
        answer = daemon.client().web(protocol.WebRequest(port=port, read_only=read_only))
        self.url = answer.url
        self.base = f"http://127.0.0.1:{port}"
        self.token = self.url.rsplit("token=", 1)[1]

    def get(self, path: str, token: str | None = None, headers: dict[str, str] | None = None,
            **kwargs: object) -> httpx.Response:
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.base + path, headers={**sent, **(headers or {})}, timeout=10, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def web(daemon: DaemonProcess) -> Web:
    return Web(daemon, _free_port())


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def _open(browser: WebDriver, web: Web, path: str = "/") -> None:
    browser.get(f"{web.base}{path}#token={web.token}")
    browser.execute_script("window.notReloaded = true")  # gone if the page ever reloads


def _script(browser: WebDriver, js: str) -> object:
    return browser.execute_script(js)


def _text(browser: WebDriver, selector: str) -> str:
    """An element's text now, read in the page (the page redraws: held references go stale)."""
    return _script(browser, f"const e = document.querySelector({json.dumps(selector)}); return e ? e.innerText : ''")  # type: ignore[return-value]


def _bar_done(browser: WebDriver, job: str) -> float | None:
    return _script(browser, f"const b = document.querySelector('.card[data-job=\"{job}\"] .bar');"  # type: ignore[return-value]
                            "return b ? Number(b.dataset.done) : null")


def test_overview_bar_advances_without_reload(web: Web, browser: WebDriver, make_job: Callable[..., Path],
                                              tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    spec = make_job("loader", PROGRESS_JOB, params=f', "20", "0.02", "{gate}"', extra="[health]\nstall_floor_s = 60\n")
    web.daemon.client().start(str(spec), {})
    _open(browser, web)
    wait_until(lambda: _bar_done(browser, "loader") == 10)  # held at the gate, halfway
    # The bound a stall would be judged at, and where it came from, as `status` says it.
    wait_until(lambda: "stall bound 60s (default floor) for" in _text(browser, '.card[data-job="loader"] .bounds'))
    gate.touch()
    wait_until(lambda: (_bar_done(browser, "loader") or 0) > 10)
    assert _script(browser, "return window.notReloaded") is True
    assert "attempt 1/" in _text(browser, '.card[data-job="loader"]')


def test_crash_appears_with_its_traceback(web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    spec = make_job("crashy", CRASHING_JOB, extra="[restart]\nmax_attempts = 1\n")
    web.daemon.client().start(str(spec), {})
    _open(browser, web, "/job/crashy")
    wait_until(lambda: "KeyError" in _text(browser, "#traceback"))
    traceback = _text(browser, "#traceback")
    assert "Traceback (most recent call last)" in traceback and "layers.0.weight_scale" in traceback
    wait_until(lambda: _text(browser, ".card .badge") == "failed")
    assert browser.find_elements(By.CSS_SELECTOR, "#events li.failure")


def test_stop_from_the_page_asks_then_stops_the_job_and_running_jobs_come_first(
        web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    client = web.daemon.client()
    client.start(str(make_job("aaa-finished", PROGRESS_JOB, params=', "2", "0.01"')), {})
    wait_until(lambda: client.status("aaa-finished").jobs[0].state == "done")
    spec = make_job("sleeper", SLEEPER)
    client.start(str(spec), {})
    pid = client.attempts("sleeper").attempts[0].pid
    assert pid is not None and psutil.pid_exists(pid)
    _open(browser, web)
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '.card[data-job="sleeper"] button.stop'))
    order = [c.get_attribute("data-job") for c in browser.find_elements(By.CSS_SELECTOR, "#jobs > .card.job")]
    assert order == ["sleeper", "aaa-finished"], order  # the running one first, whatever the names
    if cgroup.detect().kind is ContainmentKind.CGROUP:  # what the finished one used, as `status` says
        assert re.search(r"used cpu [0-9.]+s", _text(browser, '.card[data-job="aaa-finished"] .usage'))
    # Asked first: "Cancel" leaves it running, "OK" stops it.
    _click(browser, '.card[data-job="sleeper"] button.stop')
    question = _answer(browser, accept=False)
    assert question.startswith("Stop sleeper? Its whole process tree is killed"), question
    time.sleep(0.5)
    assert client.status("sleeper").jobs[0].state == "running" and psutil.pid_exists(pid)
    _click(browser, '.card[data-job="sleeper"] button.stop')
    _answer(browser, accept=True)
    wait_until(lambda: client.status("sleeper").jobs[0].state == "stopped")
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    wait_until(lambda: "stopped sleeper" in _text(browser, '.card[data-job="sleeper"] .msg'))


def test_a_bar_still_past_its_eta_and_an_ended_attempt_show_no_eta(web: Web, browser: WebDriver,
                                                                     make_job: Callable[..., Path], tmp_path: Path) -> None:
    client = web.daemon.client()
    # Ten steps 0.1 s apart, then held at 10/20: an ETA of about 1 s at its last step, which runs out.
    gate = tmp_path / "gate"
    spec = make_job("held", PROGRESS_JOB, params=f', "20", "0.1", "{gate}"',
                    extra="[health]\nstall_floor_s = 3600\n")
    client.start(str(spec), {})
    client.start(str(make_job("crashy", CRASHING_JOB, extra="[restart]\nmax_attempts = 1\n")), {})
    wait_until(lambda: client.status("crashy").jobs[0].state == "failed")
    _open(browser, web)
    wait_until(lambda: _bar_done(browser, "held") == 10)
    held = '.card[data-job="held"] .progress'
    wait_until(lambda: re.search(r"still [3-9]s", _text(browser, held)), timeout=30)
    assert "ETA" not in _text(browser, held), _text(browser, held)
    client.stop("held", None)
    wait_until(lambda: "stopped" in _text(browser, '.card[data-job="held"] .badge'))
    assert not re.search(r"ETA|still", _text(browser, held)), _text(browser, held)
    assert "ETA" not in _text(browser, '.card[data-job="crashy"]'), _text(browser, '.card[data-job="crashy"]')


def _answer(browser: WebDriver, *, accept: bool) -> str:
    """Answer the page's confirmation dialog; what it asked."""
    asked: list[str] = []

    def answered() -> bool:
        try:
            dialog = browser.switch_to.alert
        except NoAlertPresentException:
            return False
        asked.append(dialog.text)
        dialog.accept() if accept else dialog.dismiss()
        return True
    wait_until(answered)
    return asked[-1]


def _click(browser: WebDriver, selector: str) -> None:
    """Click a button the live page may be redrawing just then (a redraw replaces the element)."""
    def clicked() -> bool:
        try:
            browser.find_element(By.CSS_SELECTOR, selector).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False
    wait_until(clicked)


def test_hold_release_and_restart_from_the_page(web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    spec = make_job("sleeper", SLEEPER)
    client = web.daemon.client()
    client.start(str(spec), {})
    first = client.attempts("sleeper").attempts[0].pid
    _open(browser, web)
    card = '.card[data-job="sleeper"]'
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f"{card} button.hold"))
    _click(browser, f"{card} button.hold")
    wait_until(lambda: "held" in _text(browser, f"{card} .msg") or "hold" in _text(browser, f"{card} .msg"))
    _click(browser, f"{card} button.release")
    wait_until(lambda: "releas" in _text(browser, f"{card} .msg"))
    _click(browser, f"{card} button.restart")
    assert _answer(browser, accept=True).startswith("Restart sleeper? ")
    wait_until(lambda: len(client.attempts("sleeper").attempts) == 2)
    assert client.attempts("sleeper").attempts[1].pid != first
    wait_until(lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE)
    client.stop("sleeper", None)


def test_no_token_is_refused_and_bad_values_get_one_line(web: Web, browser: WebDriver,
                                                          make_job: Callable[..., Path]) -> None:
    browser.get(web.base + "/")
    assert "no valid token" in _text(browser, "body")
    assert browser.find_elements(By.ID, "jobs") == []
    spec = make_job("quick", PROGRESS_JOB, params=', "3", "0.01"')
    web.daemon.client().start(str(spec), {})
    port = web.base.rsplit(":", 1)[1]
    refusals = [
        (web.get("/api/stream"), 401), (web.get("/api/stream", token="wrong" * 5), 401),
        (web.get("/api/jobs/quick/log"), 401), (web.get("/api/jobs/quick/gpu"), 401),
        (web.get("/api/jobs/nosuchjob/log", token=web.token), 404),
        (web.get("/api/jobs/nosuchjob/gpu", token=web.token), 404),
        (web.get("/api/stream?job=nosuchjob", token=web.token), 404),
        (web.get("/api/stream?after=abc", token=web.token), 400),
        (web.get("/api/stream?after=-3", token=web.token), 400),
        (web.get("/api/jobs/quick/log?lines=0", token=web.token), 400),
        (web.get("/api/jobs/quick/log?attempt=x", token=web.token), 400),
        (web.get("/static/../../etc/passwd", token=web.token), 404),
        # A cookie is no token (there is none: cookies go to every port of the host).
        (httpx.post(web.base + "/api/jobs/quick/stop", cookies={f"supervise_{port}": web.token}, timeout=10), 401),
        (httpx.post(web.base + "/api/jobs/quick/stop", params={"token": web.token}, timeout=10), 403),
        (httpx.post(web.base + "/api/jobs/quick/stop", headers={"Authorization": f"Bearer {web.token}",
                                                                 "Origin": "http://evil.example"}, timeout=10), 403),
        # DNS rebinding: another site's name resolved to 127.0.0.1 reaches the port, not the page.
        (web.get("/api/stream", token=web.token, headers={"Host": f"evil.example:{port}"}), 421),
        (web.get("/", headers={"Host": f"evil.example:{port}"}), 421),
        (httpx.post(web.base + "/api/jobs/quick/launch", headers={"Authorization": f"Bearer {web.token}"}, timeout=10), 404),
    ]
    for response, status in refusals:
        assert response.status_code == status, (response.request.url, response.text)
        assert response.text.count("\n") <= 1 and response.text.strip(), response.text
    assert web.daemon.client().ping().pid == web.daemon.proc.pid  # type: ignore[union-attr]


def test_read_only_page_refuses_actions(daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    web = Web(daemon, _free_port(), read_only=True)
    spec = make_job("kept", SLEEPER)
    daemon.client().start(str(spec), {})
    response = httpx.post(web.base + "/api/jobs/kept/stop", headers={"Authorization": f"Bearer {web.token}"}, timeout=10)
    assert response.status_code == 403 and "read-only" in response.text
    assert daemon.client().status("kept").jobs[0].state == "running"


def test_token_file_is_private_and_a_remote_bind_needs_the_flag(web: Web) -> None:
    path = web.daemon.home / "web.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["token"] == web.token
    from supervisor.core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a loopback address"):
        web.daemon.client().web(protocol.WebRequest(port=_free_port(), bind="0.0.0.0"))
    with socket.socket() as holder:  # another program holds the port asked for
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(ConfigError, match=r"is taken by another process.*supervise web --port"):
            web.daemon.client().web(protocol.WebRequest(port=holder.getsockname()[1]))
    assert web.get("/", token=web.token).status_code == 200  # the page served before still is
    assert json.loads(path.read_text())["token"] == web.token


def test_390px_wide_no_horizontal_scroll(web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    spec = make_job("a-job-with-a-rather-long-name-for-a-phone", PROGRESS_JOB, params=', "40", "0.05"')
    web.daemon.client().start(str(spec), {})
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    _open(browser, web)
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, ".card .bar"))
    assert _script(browser, "return window.innerWidth") == 390
    widths = _script(browser, "const j = document.getElementById('jobs');"
                              "return [document.documentElement.scrollWidth, j.scrollWidth, j.clientWidth]")
    assert widths[0] <= 390 and widths[1] <= widths[2], widths  # type: ignore[index]


# argv: shard, gate.  Shard i counts to 10*(i+2) and holds at half its bar until the gate exists.
SHARDED_PROGRESS = """\
import os, sys, time
shard, gate = int(sys.argv[1]), sys.argv[2]
n = 10 * (shard + 2)
for i in range(1, n + 1):
    print(f"Loading checkpoint shards: {100*i//n}%|###| {i}/{n} [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.02)
    while i == n // 2 and not os.path.exists(gate):
        time.sleep(0.01)
"""


def _shard_cards(browser: WebDriver, job: str) -> list[dict[str, object]]:
    return _script(browser, f"return [...document.querySelectorAll('.card[data-job=\"{job}\"] .card.shard')].map(c => ({{"  # type: ignore[return-value]
                            "shard: Number(c.dataset.shard), state: c.dataset.state, text: c.innerText,"
                            "done: c.querySelector('.bar') ? Number(c.querySelector('.bar').dataset.done) : null,"
                            "total: c.querySelector('.bar') ? Number(c.querySelector('.bar').dataset.total) : null}))")


@pytest.mark.parametrize("width", [1200, 390])
def test_one_card_per_shard_under_its_job_updated_live(web: Web, browser: WebDriver, make_job: Callable[..., Path],
                                                       tmp_path: Path, width: int) -> None:
    gate = tmp_path / "gate"
    spec = make_job("sharded", SHARDED_PROGRESS, params=f', "{{shard}}", "{gate}"',
                    extra="[health]\nstall_floor_s = 60\n[restart]\nmax_attempts = 2\n")
    spec.write_text("shards = 3\n" + spec.read_text())  # a top-level key: before the spec's tables
    web.daemon.client().start(str(spec), {})
    if width != 1200:
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": width, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    _open(browser, web)
    # Each shard held at half its own bar: three cards under the job's, each with its state and its bar.
    wait_until(lambda: [(c["done"], c["total"]) for c in _shard_cards(browser, "sharded")] == [(10, 20), (15, 30), (20, 40)])
    cards = _shard_cards(browser, "sharded")
    assert [c["shard"] for c in cards] == [0, 1, 2] and {c["state"] for c in cards} == {"running"}
    for card in cards:
        text = str(card["text"])
        assert f"shard {card['shard']}" in text and "running" in text and "attempt 1/2 (#" in text, text
        # The rate is measured from the redraws' arrival ("–", and so no ETA, while a busy box read them in one
        # batch); held at the gate, past its ETA, each bar says how long it has stood still.
        assert "phase weight_loading" in text and re.search(r"checkpoint_shards\n(\S+ it/s\n(ETA|still) |–(\n|$))", text), text
        assert "healthy" in text or "→" in text, text
    job = '.card[data-job="sharded"]'
    assert "shards 0/3 done, 3 running, 0 failed" in _text(browser, f"{job} > .row")
    wait_until(lambda: _script(browser, f"return document.querySelector('{job} > .progress .bar').dataset.done") == "45")
    widths = _script(browser, "const j = document.getElementById('jobs');"
                              "return [document.documentElement.scrollWidth, j.scrollWidth, j.clientWidth]")
    assert widths[0] <= width and widths[1] <= widths[2], widths  # type: ignore[index]
    if shots := os.environ.get("SUPERVISE_WEB_SHOTS"):
        browser.save_screenshot(str(Path(shots) / f"web-shards-{width}.png"))
    gate.touch()
    wait_until(lambda: [c["state"] for c in _shard_cards(browser, "sharded")] == ["done"] * 3)
    assert [c["done"] for c in _shard_cards(browser, "sharded")] == [20, 30, 40]
    assert _text(browser, '.card[data-job="sharded"] > h3 .badge') == "done"
    assert _script(browser, "return window.notReloaded") is True


def _page_event_ids(browser: WebDriver) -> list[int]:
    return _script(browser, "return [...document.querySelectorAll('#events li')].map(li => Number(li.dataset.id))")  # type: ignore[return-value]


def test_reconnect_after_a_daemon_restart_has_no_gap_and_no_duplicate(
        web: Web, browser: WebDriver, make_job: Callable[..., Path], tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    spec = make_job("steady", PROGRESS_JOB, params=f', "30", "0.02", "{gate}"', extra="[health]\nstall_floor_s = 60\n")
    client = web.daemon.client()
    client.start(str(spec), {})
    _open(browser, web, "/job/steady")
    wait_until(lambda: any(e.kind == "progress" and e.data.get("done") == 15 for e in client.events("steady").events))
    wait_until(lambda: len(_page_event_ids(browser)) == len(client.events("steady").events))
    before = max(_page_event_ids(browser))
    web.daemon.kill(signal.SIGTERM)
    wait_until(lambda: "reconnecting" in _text(browser, "#conn"))
    gate.touch()  # the job writes the rest of its log while no daemon reads it
    web.daemon.start()  # recovery drains the log: new events, published to the page's stream
    client = web.daemon.client()
    wait_until(lambda: client.status("steady").jobs[0].state == "done", timeout=30)
    stored = [e.id for e in client.events("steady").events]
    wait_until(lambda: _page_event_ids(browser) == stored, timeout=15)
    assert max(stored) > before  # some events reached the page only after the restart
    assert _script(browser, "return window.notReloaded") is True
    assert _text(browser, "#conn") == "live"


def test_stuck_load_then_relaunch_on_the_job_page(home: Path, daemon_env: dict[str, str], browser: WebDriver,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    daemon_env["SUPERVISE_POLL_INTERVAL_S"] = "3600"  # all prompt below is event-driven
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        web = Web(daemon, _free_port())
        spec = home / "stuck.toml"
        command = json.dumps([sys.executable, str(REPLAY), str(STALL_TSV), "--arrivals", str(STALL_TSV), "--speed", "2",
                              "--collapse-gaps-over", "0.5", "--freeze-after", "42"])
        spec.write_text(f'name = "stuck-load"\ncommand = {command}\nprobes = ["python", "vllm", "tqdm", "transformers"]\n'
                        "stop_grace_s = 1\n[health]\nstall_floor_s = 4.0\n[restart]\nmax_attempts = 2\nbackoff_initial_s = 1\n"
                        "backoff_jitter_s = 0\n")
        client = daemon.client()
        client.start(str(spec), {})
        _open(browser, web, "/job/stuck-load")
        wait_until(lambda: len(client.attempts("stuck-load").attempts) == 2
                   and client.attempts("stuck-load").attempts[1].progress is not None, timeout=60)
        wait_until(lambda: "■" in _text(browser, "#timeline") and "▶" in _text(browser, "#timeline"))
        wait_until(lambda: "attempt 2/2" in _text(browser, "#card"))
        assert browser.find_elements(By.CSS_SELECTOR, "#events li.verdict")
        shots = os.environ.get("SUPERVISE_WEB_SHOTS")
        if shots:  # the second load under way, its bar drawn, its stall countdown running
            wait_until(lambda: _text(browser, "#card .bar") and "stalled in" in _text(browser, "#card"))
            browser.set_window_size(1200, 1500)
            browser.save_screenshot(str(Path(shots) / "web-job.png"))
            browser.get(web.base + "/")
            wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, ".card .bar"))
            browser.set_window_size(1200, 600)
            browser.save_screenshot(str(Path(shots) / "web-overview.png"))
    finally:
        daemon.close()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Another program's server on another port of the same host: what the browser sends it."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append(str(self.headers))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<p>another server</p><script>document.title = String(sessionStorage.length)</script>")

    def log_message(self, *args: object) -> None:
        pass


def test_the_token_reaches_no_other_server_on_the_host_and_leaves_the_address_bar(
        web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    """Cookies ignore ports: a cookie would go to any server on 127.0.0.1 (another user's, or one
    that took the page's port while the daemon was down).  The token is in the URL's fragment,
    then in this origin's sessionStorage, sent as a header: nothing of it leaves for another port."""
    assert "#token=" in web.url and "?token=" not in web.url
    spec = make_job("quick", PROGRESS_JOB, params=', "3", "0.01"')
    web.daemon.client().start(str(spec), {})
    _open(browser, web)
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '.card[data-job="quick"]'))
    assert "token" not in browser.current_url  # out of the address bar (and of the history)
    assert browser.get_cookies() == []
    browser.get(web.base + "/job/quick")  # another page of the same origin, no fragment: the tab kept its token
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#card .card"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _Recorder.seen.clear()
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait_until(lambda: _Recorder.seen)
        assert web.token not in "".join(_Recorder.seen)
        assert browser.title == "0"  # that origin's sessionStorage is its own: empty
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_whose_port_was_taken_while_the_daemon_was_down_is_said_by_status_and_doctor(
        web: Web, daemon_env: dict[str, str]) -> None:
    port = int(web.base.rsplit(":", 1)[1])
    served_doctor = supervise(daemon_env, "doctor", check=False)
    assert [line for line in served_doctor.stdout.splitlines() if "web page" in line and "not served" in line] == []
    web.daemon.stop()
    with socket.socket() as taker:  # another program takes the port meanwhile
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("127.0.0.1", port))
        taker.listen()
        web.daemon.start()  # the daemon runs on regardless
        status = supervise(daemon_env, "status")
        notes = [line for line in status.stdout.splitlines() if "web page is not served" in line]
        assert status.returncode == 0 and len(notes) == 1, status.stdout
        # Why, and what to do: the port is another process's; `supervise web --port` picks another.
        assert f"127.0.0.1:{port} is taken by another process" in notes[0], notes[0]
        assert "supervise web --port" in notes[0], notes[0]
        assert web.daemon.client().status().web_note == notes[0]  # typed, in `status --json` too
        doctor = supervise(daemon_env, "doctor", check=False)
        said = [line for line in doctor.stdout.splitlines() if "web page" in line and "not served" in line]
        assert len(said) == 1 and f"127.0.0.1:{port} is taken by another process" in said[0], doctor.stdout
        assert doctor.returncode == served_doctor.returncode  # optional: exit codes unchanged
    assert web.daemon.client().ping() is not None
    # Served again on a free port: the note goes, and the token is a new one (whatever took the
    # port may have been handed the old one).
    moved = _free_port()
    answer = web.daemon.client().web(protocol.WebRequest(port=moved))
    assert answer.url.startswith(f"http://127.0.0.1:{moved}/#token=") and web.token not in answer.url
    assert web.daemon.client().status().web_note == ""


def test_a_wrong_or_stale_token_says_so_and_the_printed_url_fixes_the_tab(
        web: Web, browser: WebDriver, make_job: Callable[..., Path]) -> None:
    """A tab holding a token the daemon no longer takes (`supervise web --off`, then on: a new
    token) gets one line, not a page stuck at "reconnecting"; opening the printed URL in that
    same tab (only the fragment changes: no reload by itself) takes the new token."""
    spec = make_job("quick", PROGRESS_JOB, params=', "3", "0.01"')
    web.daemon.client().start(str(spec), {})
    for path in ("/job/quick", "/"):  # "/" last: the printed URL below differs from it only by its fragment
        browser.get(f"{web.base}{path}#token={'stale' * 8}")
        wait_until(lambda: "no valid token" in _text(browser, "body"))
        assert "open the URL that `supervise web` printed" in _text(browser, "body")
        assert browser.find_elements(By.CSS_SELECTOR, ".card") == []
    browser.get(f"{web.base}/#token={web.token}")  # the same document: a fragment navigation
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '.card[data-job="quick"]'))
    assert "token" not in browser.current_url


def test_a_host_header_naming_another_site_gets_421(web: Web) -> None:
    """DNS rebinding, with the standard library's client: only the page's own addresses answer."""
    import http.client

    port = int(web.base.rsplit(":", 1)[1])

    def ask(host: str, path: str = "/") -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.putrequest("GET", path, skip_host=True)
            conn.putheader("Host", host)
            conn.putheader("Authorization", f"Bearer {web.token}")
            conn.endheaders()
            answer = conn.getresponse()
            return answer.status, answer.read().decode()
        finally:
            conn.close()

    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", f"localhost.evil.example:{port}"):
        status, text = ask(host, "/api/jobs/none/log")
        assert status == 421 and text.count("\n") == 1 and "supervise web" in text, (host, status, text)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert ask(host)[0] == 200, host


def test_the_hosts_the_page_answers_to() -> None:
    from supervisor.daemon.web._auth import allowed_hosts
    from supervisor.daemon.web._config import WebConfig

    token = "t" * 20
    assert allowed_hosts(WebConfig(bind="127.0.0.1", port=8787, token=token)) == {
        "127.0.0.1:8787", "localhost:8787", "[::1]:8787"}
    assert allowed_hosts(WebConfig(bind="::1", port=8787, token=token)) == {
        "127.0.0.1:8787", "localhost:8787", "[::1]:8787"}  # the bind written as a URL writes it
    assert "127.0.0.2:8787" in allowed_hosts(WebConfig(bind="127.0.0.2", port=8787, token=token))  # type: ignore[operator]
    assert "localhost" in allowed_hosts(WebConfig(bind="127.0.0.1", port=80, token=token))  # type: ignore[operator]
    assert allowed_hosts(WebConfig(bind="0.0.0.0", port=8787, token=token)) is None  # --allow-remote: any name


class _Impostor(http.server.BaseHTTPRequestHandler):
    """A program that took the page's port while the daemon was down: it answers everything
    (the handshake with a made-up proof, the stream with a quick reconnect) and records it all."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Impostor.seen.append(f"GET {self.path}\n{self.headers}")
        if self.path.startswith("/api/hello"):
            body, kind = json.dumps({"instance": "ab" * 16, "proof": "00" * 32}).encode(), "application/json"
        elif self.path.startswith("/api/stream"):
            body, kind = b"retry: 200\n\n", "text/event-stream"
        else:
            body, kind = b"{}", "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_took_the_port_gets_no_token_and_the_page_moved_gets_a_new_one(
        web: Web, browser: WebDriver, make_job: Callable[..., Path], daemon_env: dict[str, str]) -> None:
    """The daemon goes down under an open tab and another program takes its port: the tab sends
    it nothing of the token (no bearer, no ?token=), says why, and stops.  The daemon, started
    while the port is taken, replaces the token; `supervise web --port N` serves a new one too,
    and the old token works nowhere."""
    spec = make_job("sleeper", SLEEPER)
    client = web.daemon.client()
    client.start(str(spec), {})
    _open(browser, web, "/job/sleeper")
    wait_until(lambda: _text(browser, "#conn") == "live" and browser.find_elements(By.CSS_SELECTOR, "#card .card"))
    port = int(web.base.rsplit(":", 1)[1])
    _Impostor.seen.clear()
    web.daemon.kill(signal.SIGKILL)
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Impostor)
    thread = threading.Thread(target=impostor.serve_forever, daemon=True)
    thread.start()
    try:
        time.sleep(10)  # what a reconnecting stream or a periodic fetch would send meanwhile
        seen = "\n".join(_Impostor.seen)
        leaks = sum(web.token in request or "token=" in request or "authorization" in request.lower()
                    for request in _Impostor.seen)
        assert leaks == 0, f"{leaks} of {len(_Impostor.seen)} requests carried a token: {seen[:2000]}"
        assert _Impostor.seen and all(request.startswith("GET /api/hello?nonce=") for request in _Impostor.seen), seen
        assert "did not prove" in _text(browser, "body")
        assert "open the URL that `supervise web` printed" in _text(browser, "body")
        asked = len(_Impostor.seen)
        time.sleep(3)
        assert len(_Impostor.seen) == asked  # the tab stopped: no polling of a server that failed the proof
        web.daemon.start()  # the port is still taken: the page is not served, and its token is replaced
        assert f"127.0.0.1:{port} is taken" in web.daemon.client().status().web_note
        rotated = json.loads((web.daemon.paths.state_dir / "web.json").read_text())["token"]
        assert rotated != web.token
    finally:
        impostor.shutdown()
        impostor.server_close()
    moved = Web(web.daemon, _free_port())  # the page moves: a new token again
    assert moved.token not in (web.token, rotated)
    for stale in (web.token, rotated):
        assert moved.get("/api/jobs/sleeper/log", token=stale).status_code == 401  # the old tokens work nowhere
    assert moved.get("/api/jobs/sleeper/log", token=moved.token).status_code == 200
    hello = moved.get("/api/hello?nonce=" + "0" * 32)  # no token: the handshake proves the server, not the tab
    assert hello.status_code == 200 and set(hello.json()) == {"instance", "proof"}
    assert moved.get("/api/hello?nonce=short").status_code == 400
    _open(browser, moved)  # a tab on the printed URL proves the real daemon and runs
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '.card[data-job="sleeper"]'))
    assert _text(browser, "#conn") == "live"
    web.daemon.client().stop("sleeper", None)
