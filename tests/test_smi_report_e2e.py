"""`nvidia-smi -q` taken at a hang verdict, before the kill, through a real daemon that sees GPUs
(NVML is the faithful fake at its boundary, tests/fakes/gpu_daemon.py) and real stalled jobs:
its report is saved beside the attempt's log and named in the `stacks` event and the alert; an
`nvidia-smi` that does not answer is given up on at its bound, killed, and the job's kill goes on.

`nvidia-smi` itself cannot run on a machine without the driver: a stand-in program of that name
(`SUPERVISE_NVIDIA_SMI`) prints a report as `nvidia-smi -q` does, or, once, hangs as one whose GPU
no longer answers."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import wait_until
from e2e_jobs import AlertSink, job_state
from test_observe_e2e import FakeGpuDaemon

from supervisor.gpu import smi_report

REPORT = "==============NVSMI LOG==============\n\nDriver Version : 550.54.15\nAttached GPUs : 2\n"

# The first call to answer takes the `answered` marker (O_EXCL: one caller only) and prints the
# report; any other call, with `hang` present, writes its pid and never answers.
FAKE_SMI = f"""#!{sys.executable}
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "args"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
try:
    os.close(os.open(os.path.join(here, "answered"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    first = True
except FileExistsError:
    first = False
if not first and os.path.exists(os.path.join(here, "hang")):
    with open(os.path.join(here, "hung.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
sys.stdout.write({REPORT!r})
"""

STUCK_JOB = """\
import time
for i in range(1, 4):
    print(f"Loading checkpoint shards: {i * 10}%|###| {i}/10 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
time.sleep(3600)
"""


def _fake_smi(folder: Path, *, hang: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    if hang:
        (folder / "hang").write_text("")
    return smi


@pytest.fixture
def gpu_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpuDaemon]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    smi = _fake_smi(home / "smi", hang=True)
    d = FakeGpuDaemon(home, {**daemon_env, "SUPERVISE_FAKE_GPU_HOLDERS": str(home / "holders"),
                             "SUPERVISE_GPU_INTERVAL_S": "0.2", "SUPERVISE_NVIDIA_SMI": str(smi),
                             "SUPERVISE_ALERT_URLS": f"json://127.0.0.1:{server.server_port}/alert"})
    (home / "holders").mkdir()
    d.start()
    try:
        yield d
    finally:
        d.close()
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # two jobs judged stalled at once (the stall floor), one of them waiting out nvidia-smi's bound
def test_nvidia_smi_q_is_saved_and_named_before_the_kill_and_a_hung_one_does_not_hold_it(
        gpu_daemon: FakeGpuDaemon, home: Path, make_job: Callable[..., Path]) -> None:
    client = gpu_daemon.client()
    wait_until(lambda: client.gpus().devices, timeout=20)  # the daemon sees GPUs
    extra = "[health]\nstall_floor_s = 6\n[restart]\nmax_attempts = 1\n"
    for name in ("one", "two"):
        client.start(str(make_job(name, STUCK_JOB, extra=extra)), {})
    wait_until(lambda: all(job_state(client, n) == "failed" for n in ("one", "two")), timeout=90)

    reports = {}
    for name in ("one", "two"):
        events = client.events(name).events
        [stacks] = [e for e in events if e.kind == "stacks"]
        kill = next(i for i, e in enumerate(events) if e.kind == "action" and "killed the process tree" in e.message)
        assert events.index(stacks) < kill  # taken before the kill, and the kill went on
        assert stacks.data["gpu_report"] in stacks.message
        reports[name] = (stacks.data["gpu_report"], client.attempts(name).attempts[0].log_path)
    [(saved, log)] = [r for r in reports.values() if r[0].startswith("nvidia-smi -q saved to ")]
    [(hung, hung_log)] = [r for r in reports.values() if not r[0].startswith("nvidia-smi -q saved")]
    assert saved == f"nvidia-smi -q saved to {log}.nvidia-smi.txt"
    assert Path(f"{log}.nvidia-smi.txt").read_text() == REPORT
    assert Path(f"{log}.nvidia-smi.txt").stat().st_mode & 0o777 == 0o600
    assert hung == f"nvidia-smi -q: took more than {smi_report.TIMEOUT_S:.0f} s (a GPU that does not answer)"
    assert not Path(f"{hung_log}.nvidia-smi.txt").exists()
    assert (home / "smi" / "args").read_text() == "-q\n-q\n"
    pid = int((home / "smi" / "hung.pid").read_text())
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    alerts = wait_until(lambda: [a for a in AlertSink.received if saved in json.dumps(a)], timeout=20)
    assert "stall" in json.dumps(alerts[0]).lower()
    wait_until(lambda: [a for a in AlertSink.received if "took more than" in json.dumps(a)], timeout=20)


def test_a_hung_nvidia_smi_is_killed_at_its_bound(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = _fake_smi(home / "smi", hang=True)
    (home / "smi" / "answered").write_text("")  # every call is a later one: it hangs
    monkeypatch.setenv(smi_report.ENV_NVIDIA_SMI, str(smi))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        began = time.monotonic()
        said = asyncio.run(smi_report.take(home / "report.txt", timeout_s=1.0))
        took = time.monotonic() - began
        pid = int((home / "smi" / "hung.pid").read_text())
        wait_until(lambda: not psutil.pid_exists(pid), timeout=5)  # killed, and its exit read
        gc.collect()  # a subprocess transport left open says so when it is collected
    assert not [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert said == "nvidia-smi -q: took more than 1 s (a GPU that does not answer)"
    assert took < 4
    assert not (home / "report.txt").exists()


@pytest.mark.parametrize("named, said", [
    ("", "nvidia-smi -q: not found"),  # set empty: none to run
    ("/nonexistent/nvidia-smi", "nvidia-smi -q: not found"),
])
def test_no_nvidia_smi_is_one_line(named: str, said: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(smi_report.ENV_NVIDIA_SMI, named)
    assert asyncio.run(smi_report.take(home / "report.txt")) == said
    assert not (home / "report.txt").exists()
