"""Free disk watched during the run: a job writing 1 MiB checkpoint shards into a real 8 MiB tmpfs,
through a real daemon: warned while a write still fits, then stopped (or held, and continued once
space is freed) before a write fails for want of space."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.jobs.runner._disk import read_space

WRITER = """
import os, sys, time
out, shards, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for i in range(1, shards + 1):
    try:
        with open(os.path.join(out, f"shard_{i}.bin"), "wb") as f:
            f.write(b"x" * (1024 * 1024))
    except OSError as exc:
        print(f"checkpoint write failed: {exc}", flush=True)
        sys.exit(1)
    print(f"Saving checkpoint shards: {i}/{shards}", flush=True)
    time.sleep(pause)
print("all shards written", flush=True)
"""


@pytest.fixture
def small_disk(home: Path) -> Iterator[Path]:
    where = home / "out"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _spec(make_job: Callable[..., Path], name: str, out: Path, shards: int, pause: float, disk: str) -> Path:
    return make_job(name, WRITER, params=f', "{out}", "{shards}", "{pause}"', probes='["python", "tqdm"]',
                    extra=f'[disk]\npath = "{out}"\n{disk}\n[restart]\nmax_attempts = 3\n')


def test_a_filling_disk_is_warned_of_then_the_job_stopped_before_a_write_fails(
        daemon: DaemonProcess, make_job: Callable[..., Path], small_disk: Path) -> None:
    spec = _spec(make_job, "filler", small_disk, 12, 0.5,
                 'warn_free_mib = 5\nmin_free_mib = 2\non_low = "stop"\nevery_s = 0.1')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "filler") == "stopped", timeout=60)
    events = client.events("filler").events
    low = [e for e in events if e.kind == "disk_low"]
    assert [e.data["action"] for e in low] == ["warned", "stopped"], [e.message for e in low]
    warned, stopped = low
    assert 2 <= warned.data["free_mib"] < 5 and warned.data["path"] == str(small_disk)
    assert stopped.data["free_mib"] < 2 and "stopping the job" in stopped.message
    log = Path(client.attempts("filler").attempts[0].log_path).read_text()
    assert "checkpoint write failed" not in log and "all shards written" not in log, log
    assert len(client.attempts("filler").attempts) == 1  # a stop: no relaunch onto the same full disk
    assert read_space(str(small_disk)).free_mib >= 1  # stopped while a write still fit


def test_held_on_a_full_disk_and_continued_once_space_is_freed(
        daemon: DaemonProcess, make_job: Callable[..., Path], small_disk: Path) -> None:
    spec = _spec(make_job, "holder", small_disk, 8, 0.6,
                 'warn_free_mib = 4\nmin_free_mib = 2\non_low = "hold"\nevery_s = 0.1')
    client = daemon.client()
    client.start(str(spec), {})
    held = wait_until(lambda: [e for e in client.events("holder").events
                               if e.kind == "disk_low" and e.data["action"] == "held"], timeout=60)
    assert "held (SIGSTOP)" in held[0].message
    pid = client.status("holder").jobs[0].program_pid
    assert pid is not None and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"  # stopped
    for shard in sorted(small_disk.glob("shard_*.bin"))[:4]:
        shard.unlink()  # the user frees space
    wait_until(lambda: job_state(client, "holder") == "done", timeout=60)
    events = client.events("holder").events
    assert any(e.kind == "action" and "disk space back" in e.message and "continued (SIGCONT)" in e.message
               for e in events)
    attempt = client.attempts("holder").attempts[0]
    assert attempt.verdict == "done" and len(client.attempts("holder").attempts) == 1
    assert "all shards written" in Path(attempt.log_path).read_text()


@pytest.mark.parametrize("text, field", [
    ("warn_free_mib = -1", "disk.warn_free_mib"),
    ('warn_free_mib = "lots"', "disk.warn_free_mib"),
    ('on_low = "pause"', "disk.on_low"),
    ("every_s = 0", "disk.every_s"),
    ("min_free_mib = 20\nwarn_free_mib = 10", "lower min_free_mib"),
    ("spare = 1", "disk.spare"),
])
def test_bad_disk_settings_are_one_line_exit_65(daemon: DaemonProcess, home: Path, daemon_env: dict[str, str],
                                                text: str, field: str) -> None:
    spec = home / "bad.toml"
    spec.write_text(f'name = "bad"\ncommand = ["true"]\n[disk]\n{text}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert field in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid


def test_the_folder_watched_is_disk_path_else_the_first_output_else_the_workdir(tmp_path: Path) -> None:
    from supervisor.spec.model import JobSpec

    base = {"name": "j", "command": ["true"], "workdir": str(tmp_path), "params": {"out": "ckpt"}}
    assert JobSpec.model_validate(base).disk_folder() == str(tmp_path)
    assert JobSpec.model_validate({**base, "outputs": ["{out}/a", "b"]}).disk_folder() == str(tmp_path / "ckpt" / "a")
    assert JobSpec.model_validate({**base, "outputs": ["b"], "disk": {"path": "/data/{out}"}}).disk_folder() \
        == "/data/ckpt"


def test_a_folder_not_made_yet_is_read_on_its_parent_s_disk(tmp_path: Path) -> None:
    space = read_space(str(tmp_path / "not" / "yet"))
    assert space.path == str(tmp_path) and space.total_mib > 0
