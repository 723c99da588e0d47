"""`stop` reports what it can still see holding GPU memory, instead of claiming success: a real
daemon with a fake NVML (tests/fakes/gpu_daemon.py) whose process list the jobs declare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until
from e2e_jobs import supervise
from test_observe_e2e import FakeGpuDaemon, gpu_daemon  # noqa: F401 - the fixture

from supervisor.core.errors import RequestRejected


def holding_job(holders: Path, line: str) -> str:
    """A job that declares GPU memory (`GPU MIB [STUCK_S]`) and then runs until stopped."""
    return f"""\
    import os, time
    path = "{holders}/" + str(os.getpid())
    open(path + ".tmp", "w").write("{line}\\n")
    os.rename(path + ".tmp", path)
    print("holding", flush=True)
    while True:
        time.sleep(1)
    """


def _listed(client, pid: int) -> bool:
    return any(p["pid"] == pid for d in client.gpus().devices for p in d.processes)


def _start_holding(client, make_job, holders: Path, name: str, line: str) -> int:
    """Start a holding job; its pid once the fake NVML lists it."""
    before = _holder_pids(holders)
    # Another job's stuck memory must not hold this one back: foreign memory is ignored.
    client.start(str(make_job(name, holding_job(holders, line), extra='[gpu]\nforeign_memory = "ignore"\n')), {})
    pid = int(str(wait_until(lambda: next(iter(_holder_pids(holders) - before), 0))))
    wait_until(lambda: _listed(client, pid))
    return pid


def _holder_pids(holders: Path) -> set[int]:
    return {int(p.name) for p in holders.iterdir() if p.name.isdigit()} if holders.exists() else set()


def test_stop_reports_a_process_whose_gpu_memory_outlives_it(gpu_daemon: FakeGpuDaemon, make_job, home: Path,  # noqa: F811
                                                             daemon_env: dict[str, str]) -> None:
    holders = home / "holders"
    client = gpu_daemon.client()
    pid = _start_holding(client, make_job, holders, "stuck", "0 2048 120")
    with pytest.raises(RequestRejected) as raised:
        client.stop("stuck", grace_s=0.5)
    message = str(raised.value)
    assert f"GPU memory STILL HELD: pid {pid} (" in message and "holds 2048 MiB on GPU 0" in message, message
    assert "ended but its memory is not freed" in message, message
    assert client.status("stuck").jobs[0].state == "stopped"  # the stop itself happened
    # The CLI says the same on one line and does not exit 0.
    _start_holding(client, make_job, holders, "stuck2", "1 512 120")
    result = supervise(daemon_env, "stop", "stuck2", "--grace", "0.5", check=False)
    assert result.returncode != 0 and "GPU memory STILL HELD" in result.stderr, result
    assert "holds 512 MiB on GPU 1" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert client.ping()


def test_stop_of_a_gpu_job_whose_memory_is_freed_is_a_success(gpu_daemon: FakeGpuDaemon, make_job,  # noqa: F811
                                                              home: Path) -> None:
    holders = home / "holders"
    client = gpu_daemon.client()
    _start_holding(client, make_job, holders, "clean", "0 4096")
    response = client.stop("clean", grace_s=0.5)  # the driver's 0.3 s teardown lag is no survivor
    assert "STILL" not in response.message and response.processes, response


def test_start_says_at_once_whose_gpu_memory_it_waits_for_and_follow_launches_when_free(
        gpu_daemon: FakeGpuDaemon, make_job, home: Path, daemon_env: dict[str, str]) -> None:  # noqa: F811
    holders = home / "holders"
    client = gpu_daemon.client()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (holders / str(holder.pid)).write_text("0 40960\n")
        wait_until(lambda: _listed(client, holder.pid))
        wait_extra = '[gpu]\nforeign_memory = "wait"\nforeign_wait_s = 120\n'
        result = supervise(daemon_env, "start", str(make_job("extract", "print('extracted')", extra=wait_extra)))
        line = result.stdout.strip()
        assert result.returncode == 0 and "\n" not in line, result
        assert line.startswith(f"supervise: extract: waiting for GPU 0: pid {holder.pid} (") and \
            line.endswith("time.sleep(120)) holds 40,960 MiB"), line
        assert client.status("extract").jobs[0].state == "waiting"
        # --follow keeps following the attempt that waits, through its launch to its end.
        follow = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "start", "--follow",
                                   str(make_job("extract2", "print('extracted')", extra=wait_extra))],
                                  env=daemon_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: any(j.name == "extract2" and j.state == "waiting" for j in client.status().jobs))
        assert follow.poll() is None  # still following while it waits
        holder.kill()
        holder.wait()
        out, _ = follow.communicate(timeout=60)
        assert follow.returncode == 0, out
        assert "gpu_wait" in out and "GPUs free" in out and "launched" in out and "extract2 done" in out, out
        wait_until(lambda: client.status("extract").jobs[0].state == "done")
    finally:
        holder.kill()
        holder.wait()
