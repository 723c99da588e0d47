"""`kill_signal_first` and `checkpoint_grace_s`, end to end through a real daemon and the real CLI:
a trainer-like job that saves a checkpoint on SIGUSR1 and keeps running gets the signal before a
user's `stop` and before a watchdog kill, and its whole tree dies only after the checkpoint is written."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

# argv: the checkpoint file, a pid file.  It starts a helper child (the tree), draws a few steps of a
# progress bar, then goes quiet; on SIGUSR1 it takes 0.5 s to "save", writes the checkpoint with the
# time it did, and keeps running, as a trainer that checkpoints and carries on does.  SIGTERM ends it.
TRAINER_JOB = """\
import os, signal, subprocess, sys, time
checkpoint, pid_file = sys.argv[1], sys.argv[2]
helper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); time.sleep(600)"])
def save(*_):
    time.sleep(0.5)
    with open(checkpoint + ".tmp", "w") as f:
        f.write(f"{time.time()}\\n")
    os.replace(checkpoint + ".tmp", checkpoint)
    print("checkpoint saved", flush=True)
signal.signal(signal.SIGUSR1, save)
with open(pid_file, "w") as f:
    f.write(f"{os.getpid()} {helper.pid}\\n")
for i in range(1, 4):
    print(f"Loading checkpoint shards: {100*i//8}%|###| {i}/8 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
while True:
    time.sleep(0.1)
"""


def _with_top_level(spec: Path, lines: str) -> Path:
    """make_job's extra lands after its [env] table: top-level fields go first."""
    spec.write_text(lines + spec.read_text())
    return spec


def _tree(pid_file: Path) -> list[psutil.Process]:
    wait_until(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"))
    return [psutil.Process(int(p)) for p in pid_file.read_text().split()]


def _gone(procs: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def test_stop_sends_the_first_signal_and_waits_for_the_checkpoint_before_the_tree_dies(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    checkpoint, pid_file = home / "ckpt", home / "pids"
    spec = _with_top_level(make_job("trainer", TRAINER_JOB, params=f', "{checkpoint}", "{pid_file}"'),
                           'kill_signal_first = "USR1"\ncheckpoint_grace_s = 3\n')
    supervise(daemon_env, "start", str(spec))
    procs = _tree(pid_file)
    began = time.time()
    out = supervise(daemon_env, "stop", "trainer")
    assert "stopped trainer" in out.stdout, out.stdout + out.stderr
    assert checkpoint.exists(), "the tree was killed before the checkpoint was written"
    saved_at = float(checkpoint.read_text())
    assert began < saved_at, "the checkpoint predates the stop"
    assert _gone(procs), "a process of the tree outlived the stop"
    assert time.time() - began >= 3.0  # it kept running: the whole checkpoint_grace_s was given
    client = daemon.client()
    assert job_state(client, "trainer") == "stopped"
    said = [e.message for e in client.events("trainer").events if e.kind == "action"]
    assert any(m.startswith("sent SIGUSR1 to the program (pid ") and "ran on through checkpoint_grace_s 3s" in m
               for m in said), said


def test_a_watchdog_kill_sends_the_first_signal_and_ends_the_wait_when_the_program_exits(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    checkpoint, pid_file = home / "ckpt", home / "pids"
    # This trainer exits once its checkpoint is saved: the wait ends then, long before its grace.
    script = TRAINER_JOB.replace('print("checkpoint saved", flush=True)',
                                 'print("checkpoint saved", flush=True)\n    os._exit(0)')
    spec = _with_top_level(make_job("stalling", script, params=f', "{checkpoint}", "{pid_file}"',
                                    extra='[health]\nstall_floor_s = 1.0\n[restart]\nmax_attempts = 1\n'),
                           'kill_signal_first = "SIGUSR1"\ncheckpoint_grace_s = 60\n')
    supervise(daemon_env, "start", str(spec))
    procs = _tree(pid_file)
    client = daemon.client()
    wait_until(lambda: job_state(client, "stalling") == "failed", timeout=40)
    attempt = client.attempts("stalling").attempts[0]
    assert attempt.verdict == "stalled", attempt.reason
    assert checkpoint.exists(), "the tree was killed before the checkpoint was written"
    wait_until(lambda: _gone(procs), timeout=10)  # the helper child too: the kill still took the tree
    events = client.events("stalling").events
    flagged = next(e.ts for e in events if e.kind == "verdict" and e.data.get("verdict") == "stalled")
    assert flagged < float(checkpoint.read_text())  # asked for after the verdict, written before the kill
    sent = [e.message for e in events if e.kind == "action" and e.message.startswith("sent SIGUSR1")]
    assert sent and "it exited after" in sent[0], sent
    waited = float(sent[0].rsplit("after ", 1)[1].rstrip("s"))
    assert waited < 30, sent  # ended early, when the program exited, not at checkpoint_grace_s 60
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)


def test_an_attempt_running_unwatched_gets_the_first_signal_before_the_stop_kills_it(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    """A daemon restarted without the job's probe file cannot build its runner: the job reads
    failed while its trainer runs on, nobody watching.  `supervise stop` reaches it there (the
    stray stop), and the trainer must still be asked for its checkpoint first."""
    import signal

    pack = home / "mine.toml"
    pack.write_text('name = "mine"\n[[probes]]\nid = "hello"\nkind = "info"\nregex = "hello"\n')
    checkpoint, pid_file = home / "ckpt", home / "pids"
    spec = _with_top_level(make_job("orphaned", TRAINER_JOB, params=f', "{checkpoint}", "{pid_file}"',
                                    probes='["python"]'),
                           f'probe_files = ["{pack}"]\nkill_signal_first = "USR1"\ncheckpoint_grace_s = 2\n')
    supervise(daemon_env, "start", str(spec))
    procs = _tree(pid_file)
    daemon.kill(signal.SIGKILL)
    pack.unlink()
    daemon.start()  # recovery cannot build the runner: the job fails, its process runs on
    client = daemon.client()
    assert job_state(client, "orphaned") == "failed"
    assert not _gone(procs)
    began = time.time()
    out = supervise(daemon_env, "stop", "orphaned")
    assert "stopped orphaned" in out.stdout, out.stdout + out.stderr
    assert checkpoint.exists(), "the unwatched tree was killed before the checkpoint was written"
    assert began < float(checkpoint.read_text())
    assert _gone(procs), "a process of the tree outlived the stop"
    said = [e.message for e in client.events("orphaned").events if e.kind == "action"]
    assert any(m.startswith("sent SIGUSR1 to the program (pid ") and m.endswith("(it was running unwatched)")
               for m in said), said
