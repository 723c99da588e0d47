"""Shared fixtures: a real daemon process in a temporary state directory, real job specs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.cli.client import Client
from supervisor.core.config import Paths

REPO = Path(__file__).resolve().parents[1]

# Every process a test starts inherits these two: which test session (one per xdist worker) and which test it
# was started in, so a daemon still alive when the session ends is found, named by the test that started it, and
# stopped (see `_no_daemon_outlives_the_session`).
_SESSION_TAG = "SUPERVISE_TEST_SESSION"
_TEST_TAG = "SUPERVISE_TEST_NODE"
_DAEMON_MODULE = "supervisor.daemon.process"


def pytest_configure(config: pytest.Config) -> None:
    os.environ[_SESSION_TAG] = f"{os.getpid()}-{time.time_ns()}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up, module-scoped ones included: a daemon a fixture starts names the
    # first test that needed it.
    os.environ[_TEST_TAG] = item.nodeid


def daemons_of_this_session() -> dict[int, str]:
    """The daemons this test session started that are still alive: pid -> the test that started it."""
    import psutil

    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if _DAEMON_MODULE not in (proc.info["cmdline"] or []):
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(_SESSION_TAG) == os.environ[_SESSION_TAG]:
            found[proc.pid] = env.get(_TEST_TAG, "(before the first test)")
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_daemon_outlives_the_session() -> Iterator[None]:
    """A test session that ends with a daemon it started still running fails, naming the test that started it:
    a daemon left in a deleted temporary folder runs on, holding ports and reaping nothing, on every machine that
    runs the suite.  It is stopped here either way."""
    yield
    deadline = time.monotonic() + 10.0  # a daemon told to stop at a test's teardown may still be winding down
    while (left := daemons_of_this_session()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        pytest.fail("daemons left running after the session: " + "; ".join(
            f"pid {pid} started in {test}" for pid, test in sorted(left.items())), pytrace=False)


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.02) -> object:
    """Poll `predicate` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class DaemonProcess:
    """A real `python -m supervisor.daemon.process` in its own state directory."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.paths = Paths(home)
        self._clients: list[Client] = []

    def start(self) -> None:
        log = open(self.home / "daemon-test.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor.daemon.process"], env=self.env,
                                     stdout=log, stderr=log, start_new_session=True)
        client = self.client()
        try:
            wait_until(lambda: _pings(client), timeout=20)
        finally:
            client.close()

    def client(self) -> Client:
        client = Client(self.paths, timeout_s=60)
        self._clients.append(client)  # closed when the daemon stops
        return client

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=20)
        self._log.close()

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        elif self.proc is not None:
            self._log.close()

    def close(self) -> None:
        """The test is over: kill the jobs this home left running (they outlive a stopped daemon
        by design), then stop the daemon."""
        _kill_leftover_jobs(self.home)
        self.stop()

    def log_text(self) -> str:
        return (self.home / "daemon-test.log").read_text(errors="replace")


def _pings(client: Client) -> bool:
    return client.accepting() and client.ping() is not None


@pytest.fixture
def home() -> Iterator[Path]:
    # Short path: Unix socket paths are limited to ~100 bytes.
    path = Path(tempfile.mkdtemp(prefix="sv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SUPERVISE_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    d = DaemonProcess(home, daemon_env)
    d.start()
    yield d
    d.close()


def _kill_leftover_jobs(home: Path) -> None:
    """Tests must not leave job processes behind: kill every tagged process of this home."""
    import psutil

    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if "SUPERVISE_ATTEMPT" in env and env.get("SUPERVISE_HOME") == str(home):
            try:
                proc.kill()
            except psutil.Error:
                pass


@pytest.fixture
def make_job(home: Path) -> Callable[..., Path]:
    """Write a job spec whose command runs a Python script; returns the spec path."""

    def make(name: str, script: str, *, extra: str = "", probes: str | None = '["python", "tqdm", "transformers"]',
             params: str = "") -> Path:
        """``probes=None``: the spec names none (every pack found reads the log)."""
        jobs = home / "specs"
        jobs.mkdir(exist_ok=True)
        script_path = jobs / f"{name}.py"
        script_path.write_text(textwrap.dedent(script))
        spec = jobs / f"{name}.toml"
        spec.write_text(textwrap.dedent(f"""\
            name = "{name}"
            command = ["{{python}}", "{script_path}"{params}]
            {"" if probes is None else f"probes = {probes}"}
            stop_grace_s = 2
            [env]
            SUPERVISE_HOME = "{home}"
            """) + textwrap.dedent(extra))
        return spec

    return make
