"""Shared plumbing for the daemon benchmarks (bench_detection, bench_crash, bench_stall, bench_scale).

A real daemon (``python -m supervisor.daemon.process``) in a temporary ``SUPERVISE_HOME`` under /tmp,
job specs written next to it, percentiles, a machine note and markdown tables.  Nothing here
reaches into the daemon: figures come from what it stores (the ``events`` table) and what it
serves over its socket.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[2]
PERF = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil

from supervisor.cli.client import Client
from supervisor.core.config import Paths

PY = sys.executable
WRITER = PERF / "_writer.py"
STAMP = PERF / "_stamp.py"
# The packs a vLLM/transformers job would name (as tests/test_health_e2e.py does).
PACKS = ["python", "cuda", "nccl", "vllm", "tqdm", "transformers"]
FINISHED = ("done", "failed", "stopped")


# -- the daemon ---------------------------------------------------------------------------

class Daemon:
    """A real daemon process in its own temporary state directory; a context manager."""

    def __init__(self, *, env: dict[str, str] | None = None, keep: bool = False, tree: Path | None = None) -> None:
        """``tree``: another checkout whose daemon runs (a before/after in one run); this one's by default."""
        self.home = Path(tempfile.mkdtemp(prefix="svb-", dir="/tmp"))  # short: socket paths are limited
        self.paths = Paths(self.home)
        self.tree = tree or ROOT
        self.env = dict(os.environ)
        self.env["SUPERVISE_HOME"] = str(self.home)
        self.env["PYTHONPATH"] = str(self.tree) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.update(env or {})
        self.keep = keep
        self.proc: subprocess.Popen[bytes] | None = None
        self._clients: list[Client] = []

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._log = open(self.home / "daemon.out", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([PY, "-m", "supervisor.daemon.process"], env=self.env, cwd=str(self.tree),
                                     stdout=self._log, stderr=self._log, start_new_session=True)
        client = self.client()
        wait_until(lambda: client.accepting() and client.ping() is not None, 20, "the daemon to answer")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def process(self) -> psutil.Process:
        return psutil.Process(self.pid)

    def client(self) -> Client:
        client = Client(self.paths, timeout_s=120)
        self._clients.append(client)
        return client

    def db(self) -> sqlite3.Connection:
        """A read-only connection to the daemon's store (autocommit: every query sees the latest commit)."""
        db = sqlite3.connect(f"file:{self.paths.db}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout=5000")
        return db

    def spec(self, name: str, argv: Sequence[str], *, probes: Sequence[str] = PACKS, extra: str = "") -> Path:
        path = self.home / "specs" / f"{name}.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f'name = "{name}"\ncommand = {json.dumps(list(argv))}\nprobes = {json.dumps(list(probes))}\n'
                        f"stop_grace_s = 1\n{extra}")
        return path

    def start_jobs(self, specs: Sequence[Path], workers: int = 8) -> list[Any]:
        """Start jobs through the API, a few requests at a time; returns the StartResponses in order."""
        if len(specs) == 1:
            return [self.client().start(str(specs[0]), {})]
        clients = [self.client() for _ in range(min(workers, len(specs)))]
        with ThreadPoolExecutor(len(clients)) as pool:
            futures = [pool.submit(clients[i % len(clients)].start, str(s), {}) for i, s in enumerate(specs)]
            return [f.result() for f in futures]

    def wait_finished(self, jobs: Iterable[str], timeout: float) -> None:
        client = self.client()
        names = set(jobs)
        def finished() -> bool:
            states = {j.name: j.state for j in client.status().jobs}
            return all(states.get(name) in FINISHED for name in names)

        wait_until(finished, timeout, f"{len(names)} jobs to finish", interval=0.1)

    def job_processes(self) -> list[psutil.Process]:
        """Every process launched for this daemon's jobs (they carry its SUPERVISE_HOME)."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                env = proc.environ()
            except psutil.Error:
                continue
            if "SUPERVISE_ATTEMPT" in env and env.get("SUPERVISE_HOME") == str(self.home):
                found.append(proc)
        return found

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the daemon detaches from its jobs...
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for proc in self.job_processes():  # ...which this benchmark then ends, pid by pid
            try:
                proc.kill()
            except psutil.Error:
                pass
        self._log.close()
        if not self.keep:
            shutil.rmtree(self.home, ignore_errors=True)


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark gave up: waited {timeout:.0f}s for {what}")
        time.sleep(interval)


def write_go(path: Path, delay_s: float = 0.3) -> float:
    """Tell the waiting writers to start at a common instant; returns that instant (time.time())."""
    start_at = time.time() + delay_s
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{start_at:.6f}\n")
    tmp.rename(path)
    return start_at


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """End a helper started here with start_new_session=True: its whole process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stamp_of(line: str) -> float | None:
    """The time.time() a writer put at the start of its line."""
    head = line.split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None


# -- responsiveness -----------------------------------------------------------------------

def open_page(d: Daemon, port: int) -> tuple[str, str]:
    """Turn the daemon's page on (``supervise web``); its base URL and token."""
    from urllib.parse import parse_qs, urlparse

    from supervisor.core.protocol import WebRequest

    url = d.client().web(WebRequest(port=port)).url
    parsed = urlparse(url)
    token = (parse_qs(parsed.query).get("token") or parse_qs(parsed.fragment).get("token") or [""])[0]
    return f"{parsed.scheme}://{parsed.netloc}", token


def page_first_data(base: str, token: str, job: str) -> tuple[float, float]:
    """Open the job page's feed as a browser does (``/api/stream?job=J&after=0``): seconds from the
    request to its first data (the history's first event), and to its first status payload."""
    import httpx

    t = time.perf_counter()
    first = math.nan
    status = False
    with httpx.stream("GET", f"{base}/api/stream?job={job}&after=0",
                      headers={"Authorization": f"Bearer {token}"}, timeout=30) as feed:
        for line in feed.iter_lines():
            if line.startswith("data: "):
                if math.isnan(first):
                    first = time.perf_counter() - t
                if status:
                    return first, time.perf_counter() - t
            status = line == "event: status"
    return first, math.nan


# -- figures ------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    value = seconds * 1000
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine_note() -> str:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    try:
        tree = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10, check=False).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        tree = "?"
    return (f"machine: nproc {os.cpu_count()}, CPU {model}, kernel {platform.release()}, "
            f"Python {platform.python_version()}; tree {tree}; "
            f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
