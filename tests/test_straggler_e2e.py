"""The straggler: torchrun with three gloo ranks on the CPU, each printing its own steps, one of
them slower, through a real daemon: the slow rank is named (its pid found by its environment),
with a stacks event, and a warning alert to a real HTTP endpoint; never a kill.  Its GPU is named
from the GPU sample's processes (three rank processes, NVML the faithful fake at its boundary)."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import AlertSink, supervise

from supervisor.cli.client import Client

pytest.importorskip("torch")  # the torchrun tests; the GPU-naming one runs ranks without torch

RANKS = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
slow_rank, slow_s, fast_s, steps = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
t = torch.ones(1)
dist.all_reduce(t)  # the group is up before the steps begin
with open(os.environ["PIDS_DIR"] + f"/rank{rank}", "w") as f:
    f.write(str(os.getpid()))
for step in range(1, steps + 1):
    time.sleep(slow_s if rank == slow_rank else fast_s)  # no collective per step: each rank at its own pace
    print(f"train step {step}/{steps} loss=1.0 acc0=0.5 tok/s=100.0", flush=True)
dist.barrier()
if rank == 0:
    print(f"train done: {steps} steps", flush=True)
dist.destroy_process_group()
"""


def torchrun_spec(home: Path, name: str, args: list[str], extra: str = "") -> Path:
    script = home / f"{name}.py"
    script.write_text(textwrap.dedent(RANKS))
    (home / "pids").mkdir(exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
               "--tee", "3", str(script), *args]
    spec = home / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = {json.dumps(command)}\nprobes = ["python", "torch", "train"]\n'
                    f'stop_grace_s = 2\n[env]\nPIDS_DIR = "{home / "pids"}"\nSUPERVISE_HOME = "{home}"\n'
                    f'OMP_NUM_THREADS = "1"\n' + textwrap.dedent(extra))
    return spec


@pytest.fixture
def alerting(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
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


def finished(client: Client, job: str) -> bool:
    return client.status(job).jobs[0].state in ("done", "failed", "stopped")


def test_the_slow_rank_is_named_warned_about_and_not_killed(alerting: DaemonProcess, home: Path) -> None:
    spec = torchrun_spec(home, "ranks", ["2", "0.4", "0.08", "30"],
                         "[health]\nstraggler_factor = 2.0\nstraggler_steps = 4\n[restart]\nmax_attempts = 1\n")
    client = alerting.client()
    client.start(str(spec), {})
    found = wait_until(lambda: [e for e in client.events("ranks").events if e.kind == "straggler"], timeout=90)
    slow_pid = int((home / "pids" / "rank2").read_text())
    wait_until(lambda: finished(client, "ranks"), timeout=90)
    attempt = client.attempts("ranks").attempts[0]
    assert attempt.verdict == "done", attempt.reason  # a warning, never a kill
    events = client.events("ranks").events
    stragglers = [e for e in events if e.kind == "straggler"]
    assert len(stragglers) == 1, [e.message for e in stragglers]  # once per streak, not once per step
    event = stragglers[0]
    assert event.data["process"] == "tee=default2"
    assert event.data["pid"] == slow_pid and event.data["host"] == "local"
    assert f"pid {slow_pid}" in event.message and "straggler tee=default2" in event.message
    assert event.data["peers"] == 2 and event.data["steps"] == 4
    assert event.data["step_s"] > 2.0 * event.data["peers_rate_s"]
    assert found[0].id == event.id
    # Its stack was asked for: taken where py-spy can attach, else one line saying why not.
    stacks = [e for e in events if e.kind == "stacks" and "straggler" in e.message]
    assert len(stacks) == 1 and "tee=default2" in stacks[0].message
    assert f"pid {slow_pid} " in stacks[0].message or "no stacks" in stacks[0].message, stacks[0].message
    assert not any(e.kind == "action" and "killed the process tree" in e.message for e in events)
    alerts = wait_until(lambda: [a for a in AlertSink.received if "straggler" in json.dumps(a)], timeout=20)
    assert "tee=default2" in json.dumps(alerts[0]) and str(slow_pid) in json.dumps(alerts[0])
    assert not psutil.pid_exists(slow_pid) or psutil.Process(slow_pid).status() == psutil.STATUS_ZOMBIE


def test_ranks_at_one_pace_raise_no_straggler(daemon: DaemonProcess, home: Path) -> None:
    spec = torchrun_spec(home, "even", ["-1", "0.1", "0.1", "25"], "[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "even"), timeout=90)
    attempt = client.attempts("even").attempts[0]
    assert attempt.verdict == "done", attempt.reason
    events = client.events("even").events
    assert sum(1 for e in events if e.kind == "progress") >= 3
    assert not [e for e in events if e.kind == "straggler"]


@pytest.mark.parametrize("line, field", [
    ("straggler_factor = 1", "health.straggler_factor"),
    ("straggler_factor = -2", "health.straggler_factor"),
    ('straggler_factor = "fast"', "health.straggler_factor"),
    ("straggler_factor = nan", "health.straggler_factor"),
    ("straggler_steps = 0", "health.straggler_steps"),
    ("straggler_steps = 2.5", "health.straggler_steps"),
    ('straggler_steps = "many"', "health.straggler_steps"),
])
def test_bad_straggler_settings_are_one_line_exit_65(daemon: DaemonProcess, home: Path, daemon_env: dict[str, str],
                                                      line: str, field: str) -> None:
    spec = home / "bad.toml"
    spec.write_text(f'name = "bad"\ncommand = ["true"]\n[health]\n{line}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert field in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid


# Three rank processes without torch (each its own RANK, as torchrun sets it), each holding memory
# on its own GPU as the fake NVML lists it (tests/fakes/gpu_daemon.py); rank 2 is the slow one.
RANKS_ON_GPUS = """
import os, subprocess, sys, time
holders, steps = sys.argv[1], 20
RANK = '''
import os, sys, time
rank, holders, steps = int(os.environ["RANK"]), sys.argv[1], int(sys.argv[2])
open(os.path.join(holders, str(os.getpid())), "w").write(f"{rank} 1000\\\\n")
open(os.path.join(holders, f"rank{rank}.pid"), "w").write(str(os.getpid()))
time.sleep(1.0)  # the GPU sampler sees each rank before its steps begin
for step in range(1, steps + 1):
    time.sleep(0.4 if rank == 2 else 0.08)
    print(f"[rank{rank}]: train step {step}/{steps} loss=1.0 acc0=0.5 tok/s=100.0", flush=True)
'''
ranks = [subprocess.Popen([sys.executable, "-c", RANK, holders, str(steps)], env={**os.environ, "RANK": str(r)})
         for r in range(3)]
sys.exit(max(p.wait() for p in ranks))
"""


@pytest.fixture
def gpu_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    from test_observe_e2e import FakeGpuDaemon

    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    (home / "holders").mkdir()
    daemon = FakeGpuDaemon(home, {**daemon_env, "SUPERVISE_FAKE_GPU_HOLDERS": str(home / "holders"),
                                  "SUPERVISE_FAKE_GPUS": "3", "SUPERVISE_GPU_INTERVAL_S": "0.2"})
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()


def test_the_straggler_s_gpu_is_named_from_the_gpu_sample(gpu_daemon: DaemonProcess, home: Path) -> None:
    (home / "ranks.py").write_text(textwrap.dedent(RANKS_ON_GPUS))
    spec = home / "gpus.toml"
    spec.write_text(f'name = "gpus"\ncommand = ["{sys.executable}", "{home / "ranks.py"}", "{home / "holders"}"]\n'
                    'probes = ["python", "train"]\nstop_grace_s = 2\n'
                    "[health]\nstraggler_factor = 2.0\nstraggler_steps = 3\n[restart]\nmax_attempts = 1\n")
    client = gpu_daemon.client()
    client.start(str(spec), {})
    [event] = wait_until(lambda: [e for e in client.events("gpus").events if e.kind == "straggler"], timeout=60)
    slow_pid = int((home / "holders" / "rank2.pid").read_text())
    assert (event.data["process"], event.data["pid"], event.data["gpu"]) == ("rank=2", slow_pid, 2), event.data
    assert event.message.startswith(f"straggler rank=2 (pid {slow_pid}, host local, GPU 2): "), event.message
    wait_until(lambda: finished(client, "gpus"), timeout=60)
    assert client.attempts("gpus").attempts[0].verdict == "done"
