"""A full disk under a running job: the daemon lives on, says so, and loses nothing it stored."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state


@pytest.fixture
def small_home(daemon_env: dict[str, str]) -> Iterator[Path]:
    """A 4 MiB tmpfs as the daemon's state directory (store and logs both live there)."""
    home = Path(tempfile.mkdtemp(prefix="sv-full-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(home)], capture_output=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (the test runs as root): {mounted.stderr.decode()}"
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)
        home.rmdir()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _command_alive(wrapper_pid: int, script: Path) -> bool:
    """Whether the job's own command still runs under its wrapper.  Not "the wrapper has a child":
    while the disk is full the wrapper retries writing the exit status with a `sleep 1` child,
    so a child is there nearly all the time after the command ended."""
    import psutil

    try:
        children = psutil.Process(wrapper_pid).children() if _alive(wrapper_pid) else []
        return any(str(script) in child.cmdline() and _alive(child.pid) for child in children)
    except psutil.Error:
        return False


def test_daemon_survives_a_full_disk_and_keeps_what_it_stored(small_home: Path, daemon_env: dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**daemon_env, "SUPERVISE_HOME": str(small_home)}
    monkeypatch.setenv("SUPERVISE_HOME", str(small_home))
    gate = small_home / "gate"
    script = small_home / "job.py"
    script.write_text(
        "import os, sys, time\n"
        "for i in range(1, 201):\n"
        "    if i == 20:\n"
        f"        while not os.path.exists('{gate}'):\n"
        "            time.sleep(0.01)\n"
        "    print(f'Loading checkpoint shards: {i//2}%|#| {i}/200 [00:00<00:01, 5.0it/s]', flush=True)\n"
        "    time.sleep(0.005)\n")
    spec = small_home / "fill.toml"
    spec.write_text(f'name = "fill"\ncommand = ["{os.sys.executable}", "{script}"]\nprobes = ["transformers"]\n'
                    "[restart]\nmax_attempts = 1\n")
    daemon = DaemonProcess(small_home, env)
    daemon.start()
    try:
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: (steps := [e for e in client.events("fill").events if e.kind == "progress"])
                   and steps[-1].data["done"] >= 19)
        events = client.events("fill").events
        # The bar's latest row stands for its end until a later line replaces it: all but it stay.
        latest = [e for e in events if e.kind == "progress"][-1]
        stored_before = [(e.id, e.message) for e in events if e is not latest]
        filler = small_home / "filler"
        # Fill the disk to the last byte, unbuffered: a buffered file keeps what did not fit and
        # raises ENOSPC once more when it is closed.
        with open(filler, "wb", buffering=0) as f:
            block = b"\0" * 65536
            try:
                while True:
                    f.write(block)
            except OSError:
                pass
            try:
                while True:
                    f.write(b"\0")
            except OSError:
                pass
        gate.write_text("")  # the job goes on writing; neither its log nor the store has room
        # The command ends; its wrapper waits for room to write the exit status.
        wait_until(lambda: client.attempts("fill").attempts[0].pid is not None
                   and not _command_alive(client.attempts("fill").attempts[0].pid, script), timeout=60)
        assert client.ping().pid == daemon.proc.pid  # the same daemon, still answering while the disk is full
        filler.unlink()  # room again: the run's end reaches the store
        wait_until(lambda: job_state(client, "fill") in ("done", "failed"), timeout=60)
        after = {(e.id, e.message) for e in client.events("fill").events}
        assert set(stored_before) <= after  # nothing stored before the disk filled was lost
        assert client.ping().pid == daemon.proc.pid
    finally:
        daemon.close()
