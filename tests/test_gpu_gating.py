"""No relaunch while the previous attempt still holds GPU memory (an in-process daemon with a
fake NVML whose memory follows real processes, freed a moment after each one dies, as the
driver does)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import wait_until
from fakes.fake_nvml import FakeNvml

from supervisor.cli.client import Client
from supervisor.core.config import DaemonSettings, Paths
from supervisor.core.errors import RequestRejected
from supervisor.daemon.process import Daemon

HOLD_MIB = 8000
FREE_LAG_S = 1.5


class ProcessBoundNvml(FakeNvml):
    """Every live process that carries a pid file in `holders` holds HOLD_MIB on GPU 0,
    and keeps holding it for FREE_LAG_S after it exits."""

    def __init__(self, holders: Path) -> None:
        super().__init__(clock=time.monotonic)
        self.holders = holders
        self.died_at: dict[int, float] = {}
        self.add_device(total_mib=81920)

    def _sync(self) -> None:
        for pid_file in self.holders.glob("*.pid"):
            text = pid_file.read_text()
            if not text:
                continue
            pid = int(text)
            known = any(p.pid == pid for p in self.processes)
            if not known and _alive(pid):
                self.start_process(pid, gpu=0, mib=HOLD_MIB)
            elif known and pid not in self.died_at and not _alive(pid):
                self.died_at[pid] = self.clock()
                self.exit_process(pid, free_lag_s=FREE_LAG_S)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._sync()
        return super().nvmlDeviceGetMemoryInfo(handle, version)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._sync()
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


@contextlib.contextmanager
def in_process_daemon(nvml: FakeNvml) -> Iterator[Client]:
    """A real daemon (its own event loop, in a thread) whose NVML is the given fake."""
    home = Path(tempfile.mkdtemp(prefix="sv-", dir="/tmp"))
    daemon = Daemon(Paths(home), DaemonSettings(gpu_interval_s=0.1), nvml=nvml)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(daemon.serve(),), daemon=True)
    thread.start()
    client = Client(Paths(home))
    try:
        wait_until(lambda: _pings(client))
        yield client
    finally:
        loop.call_soon_threadsafe(daemon.request_stop)
        thread.join(timeout=30)
        loop.close()
        client.close()
        shutil.rmtree(home, ignore_errors=True)


def test_relaunch_waits_for_gpu_memory_release(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    script = tmp_path / "gpu_job.py"
    script.write_text(
        "import os, sys, time\n"
        f"open('{holders}/' + str(os.getpid()) + '.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(0.3)\nraise RuntimeError('attempt ' + os.environ['SUPERVISE_ATTEMPT'])\n")
    spec = tmp_path / "gpu.toml"
    spec.write_text(f'name = "gpu"\ncommand = ["{sys.executable}", "{script}"]\n'
                    "[restart]\nmax_attempts = 2\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n"
                    "[gpu]\nrelease_timeout_s = 20\nrelease_tolerance_mib = 100\n")
    nvml = ProcessBoundNvml(holders)
    with in_process_daemon(nvml) as client:
        client.start(str(spec), {})
        wait_until(lambda: client.status("gpu").jobs[0].state == "failed", timeout=60)
        _first, second = client.attempts("gpu").attempts
        # The job's python process is the wrapper's child: find the pid the fake saw die first.
        freed_at = min(nvml.died_at.values()) + FREE_LAG_S  # the fake's (monotonic) clock
        launched_second = second.started  # wall clock
        offset = time.time() - time.monotonic()
        assert launched_second >= freed_at + offset - 0.05, "relaunched while memory was still held"
        actions = [e.message for e in client.events("gpu").events if e.kind == "action"]
        assert any(m.startswith("GPU memory released after") for m in actions)


def _foreign_holder(holders: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A process that is not the supervisor's and holds GPU memory (per the fake) for `seconds`."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    (holders / f"{proc.pid}.pid").write_text(str(proc.pid))
    return proc


def _plain_spec(tmp_path: Path, name: str, foreign: str) -> Path:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = ["{sys.executable}", "-c", "print(1)"]\n'
                    f'[gpu]\nforeign_memory = "{foreign}"\nforeign_wait_s = 30\n')
    return spec


def test_prelaunch_refuses_gpus_held_by_others_and_says_whose(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    holder = _foreign_holder(holders, 30)
    try:
        with in_process_daemon(ProcessBoundNvml(holders)) as client:
            wait_until(lambda: client.gpus().devices and client.gpus().devices[0].used_mib > HOLD_MIB)
            with pytest.raises(RequestRejected) as info:
                client.start(str(_plain_spec(tmp_path, "refused", "refuse")), {})
            message = str(info.value)
            assert f"GPU 0: pid {holder.pid} (" in message and f"holds {HOLD_MIB:,} MiB" in message and "sleep" in message
            assert client.attempts("refused").attempts == []  # nothing was launched
    finally:
        holder.kill()
        holder.wait()


def test_a_wait_for_gpus_is_said_at_once_and_ends_with_the_sample_that_shows_them_free(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    holder = _foreign_holder(holders, 60)
    try:
        with in_process_daemon(ProcessBoundNvml(holders)) as client:
            wait_until(lambda: client.gpus().devices and client.gpus().devices[0].used_mib > HOLD_MIB)
            # `start` answers at once, naming whose memory it waits for; nothing launches meanwhile.
            response = client.start(str(_plain_spec(tmp_path, "patient", "wait")), {})
            assert response.message.startswith(f"patient: waiting for GPU 0: pid {holder.pid} ("), response.message
            assert f"holds {HOLD_MIB:,} MiB" in response.message and "sleep" in response.message
            assert response.attempt == 1 and client.attempts("patient").attempts == []
            status = client.status("patient").jobs[0]
            assert status.state == "waiting" and f"pid {holder.pid}" in status.reason, status
            waits = client.events("patient", kinds=["gpu_wait"]).events
            assert len(waits) == 1 and waits[0].attempt == 1, waits
            assert waits[0].data["holders"] == [{"pid": holder.pid, "gpu": 0, "used_mib": HOLD_MIB,
                                                 "command": waits[0].data["holders"][0]["command"]}]
            assert "sleep" in waits[0].data["holders"][0]["command"]

            killed_at = time.time()
            holder.kill()
            holder.wait()
            # Followed from the attempt that waited: the wait, its end, the launch, the exit.
            kinds = [e.kind for e in client.follow_events("patient", min_attempt=response.attempt, until_done=True)]
            assert kinds[:1] == ["gpu_wait"] and "launched" in kinds, kinds
            assert client.status("patient").jobs[0].state == "done"
            # The GPU sample that showed the memory free woke the launch (no timer of its own), and
            # that sample was taken after the holder had gone.
            free = [e for e in client.events("patient", kinds=["action"]).events if e.message.startswith("GPUs free")]
            assert len(free) == 1 and free[0].data["woken_by"] == "gpu_sample", free
            assert free[0].data["sample_ts"] >= killed_at
            assert client.attempts("patient").attempts[0].started >= free[0].data["sample_ts"]
    finally:
        holder.kill()
        holder.wait()


def test_a_sharded_job_says_at_once_which_shards_wait_for_gpus(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    holder = _foreign_holder(holders, 60)
    spec = tmp_path / "sharded.toml"
    spec.write_text(f'name = "sharded"\nshards = 2\ncommand = ["{sys.executable}", "-c", "print(1)"]\n'
                    '[gpu]\nforeign_wait_s = 60\n')
    try:
        with in_process_daemon(ProcessBoundNvml(holders)) as client:
            wait_until(lambda: client.gpus().devices and client.gpus().devices[0].used_mib > HOLD_MIB)
            message = client.start(str(spec), {}).message
            assert message.startswith("sharded: shard ") and f"waiting for GPU 0: pid {holder.pid} (" in message, message
            holder.kill()
            holder.wait()
            wait_until(lambda: client.status("sharded").jobs[0].state == "done", timeout=30)
    finally:
        holder.kill()
        holder.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pings(client: Client) -> bool:
    return client.accepting() and client.ping() is not None
