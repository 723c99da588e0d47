"""Relaunches that start elsewhere, end to end through a real daemon, real jobs and the real CLI:
from the checkpoint before one that fails to load (`checkpoints`, `{last_checkpoint}`), and with
parameters a `[restart.adjust]` rule changed after the verdict (an OOM at half the batch size)."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import AlertSink, supervise

from supervisor.cli.client import Client

# argv: the checkpoint to start from ("" none).  Loading it comes before any progress: a corrupt
# state.json raises there, as a torch.load of a truncated file would.
CHECKPOINT_JOB = """\
import json, os, sys, time
ckpt = sys.argv[1]
print(f"starting from {ckpt or 'scratch'}", flush=True)
step = json.load(open(os.path.join(ckpt, "state.json")))["step"] if ckpt else 0
for i in range(1, 4):
    print(f"train: {100 * i // 3}%|###| {i}/3 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
print(f"done from step {step}", flush=True)
"""

# argv: the batch size.  Over 16 it runs out of GPU memory as torch says it (the class's module is
# torch, so the traceback's last line reads `torch.OutOfMemoryError: CUDA out of memory...`).
OOM_JOB = """\
import sys, time
batch = sys.argv[1]
print(f"batch size {batch}", flush=True)
if int(batch) > 16:
    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB")
for i in range(1, 4):
    print(f"train: {100 * i // 3}%|###| {i}/3 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
"""

FAST_RESTART = "[restart]\nmax_attempts = 3\nbackoff_initial_s = 0.1\nbackoff_jitter_s = 0\n"


def _checkpoint(root: Path, name: str, state: str | None, complete: bool = True) -> Path:
    path = root / name
    path.mkdir(parents=True)
    if state is not None:
        (path / "state.json").write_text(state)
    if complete:
        (path / "COMPLETE").write_text("")
    return path


def _ended(client: Client, job: str) -> bool:
    return client.status(job).jobs[0].state in ("done", "failed", "stopped")


@pytest.fixture
def alerts(daemon_env: dict[str, str]) -> Iterator[list[dict]]:
    """A real HTTP endpoint the daemon alerts (started before the daemon: it reads the URL once)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    yield AlertSink.received
    server.shutdown()
    server.server_close()


def test_a_checkpoint_that_fails_to_load_is_passed_over_for_the_one_before(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    out = home / "out"
    _checkpoint(out, "step_1", '{"step": 1}')
    _checkpoint(out, "step_2", '{"step": 2}')
    _checkpoint(out, "step_3", '{"step": 3, "trunc')  # corrupt: fails on loading, as step_10 does
    _checkpoint(out, "step_10", '{"step": 10, "trunc')  # newest by its number (by text it sorts second)
    _checkpoint(out, "step_11", None, complete=False)  # half written: no COMPLETE marker
    spec = make_job("ckpt", CHECKPOINT_JOB, params=', "{last_checkpoint}"', extra=FAST_RESTART)
    spec.write_text('checkpoints = "{out}/step_*"\ncheckpoint_complete = "COMPLETE"\n' + spec.read_text()
                    + f'[params]\nout = "{out}"\n')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: _ended(client, "ckpt"), timeout=60)
    attempts = client.attempts("ckpt").attempts
    # step_10 and step_3 fail alike (one fingerprint): not "a deterministic bug" while step_2 is left to try.
    assert [a.checkpoint for a in attempts] == [str(out / "step_10"), str(out / "step_3"), str(out / "step_2")]
    assert [a.verdict for a in attempts] == ["crashed", "crashed", "done"], [a.reason for a in attempts]
    assert attempts[0].fingerprint == attempts[1].fingerprint is not None
    assert client.status("ckpt").jobs[0].state == "done"
    text = supervise(daemon_env, "attempts", "ckpt").stdout
    assert f"from checkpoint: {out / 'step_2'}" in text, text
    starts = [e.message for e in client.events("ckpt").events if e.kind == "action" and "starts" in e.message]
    assert starts[0] == f"attempt 1 starts from checkpoint {out / 'step_10'}", starts
    log = supervise(daemon_env, "logs", "ckpt").stdout
    assert "done from step 2" in log, log


def test_the_same_failure_from_the_oldest_checkpoint_is_a_deterministic_bug(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job, home: Path) -> None:
    out = home / "out"
    _checkpoint(out, "step_1", "{")
    _checkpoint(out, "step_2", "{")
    spec = make_job("broken", CHECKPOINT_JOB, params=', "{last_checkpoint}"', extra=FAST_RESTART)
    spec.write_text(f'checkpoints = "{out}/step_*"\n' + spec.read_text())  # no marker: each one counts
    fresh = make_job("fresh", CHECKPOINT_JOB, params=', "{last_checkpoint}"', extra=FAST_RESTART)
    fresh.write_text(f'checkpoints = "{home}/none/step_*"\n' + fresh.read_text())  # matches nothing
    supervise(daemon_env, "start", str(spec))
    supervise(daemon_env, "start", str(fresh))
    client = daemon.client()
    wait_until(lambda: _ended(client, "broken") and _ended(client, "fresh"), timeout=60)
    attempts = client.attempts("broken").attempts
    assert [a.checkpoint for a in attempts] == [str(out / "step_2"), str(out / "step_1")]
    assert "same failure twice" in (attempts[-1].action or ""), attempts[-1].action
    assert client.status("broken").jobs[0].state == "failed"
    attempt = client.attempts("fresh").attempts[0]  # none found: {last_checkpoint} is empty
    assert attempt.verdict == "done" and attempt.checkpoint is None and attempt.argv[-1] == ""
    # A bad rule is refused at start, in one line with the spec error's exit code; nothing stored is lost.
    spec.write_text(spec.read_text() + '[restart.adjust]\ncrashed = { batch_size = "x0.5" }\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 65 and len(lines) == 1, (result.returncode, result.stderr)
    assert "restart.adjust.crashed" in lines[0] and "'batch_size' is not in [params]" in lines[0], lines
    assert len(client.attempts("broken").attempts) == 2 and client.status("broken").jobs[0].state == "failed"


def test_an_oom_is_relaunched_at_half_the_batch_size_and_half_again(alerts: list[dict], daemon: DaemonProcess,
                                                     daemon_env: dict[str, str], make_job, home: Path) -> None:
    spec = make_job("oomy", OOM_JOB, params=', "{batch_size}"', probes='["python", "tqdm", "cuda"]',
                    extra=FAST_RESTART + '[restart.adjust]\noom = { batch_size = "x0.5", min = "8" }\n')
    spec.write_text(spec.read_text() + '[params]\nbatch_size = "64"\n')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: _ended(client, "oomy"), timeout=60)
    attempts = client.attempts("oomy").attempts
    # The same OOM twice: not "a deterministic bug" while the batch size still changes.
    assert [a.verdict for a in attempts] == ["oom", "oom", "done"], [a.reason for a in attempts]
    assert attempts[0].fingerprint == attempts[1].fingerprint is not None
    assert [a.argv[-1] for a in attempts] == ["64", "32", "16"]
    assert [a.params for a in attempts] == [None, {"batch_size": "32"}, {"batch_size": "16"}]  # None: the spec's own
    text = supervise(daemon_env, "attempts", "oomy").stdout
    assert "params: batch_size=32" in text and "params: batch_size=16" in text, text
    # The relaunch alert says what changed (the second OOM's is folded into the next alert, as repeats are).
    wait_until(lambda: any("attempt 1 oom" in json.dumps(a) for a in alerts), timeout=20)
    relaunch = next(json.dumps(a) for a in alerts if "attempt 1 oom" in json.dumps(a))
    assert "next: relaunch in 0.1s; with batch_size=32 (was 64)" in relaunch, relaunch
    starts = [e.message for e in client.events("oomy").events if e.kind == "action" and "starts" in e.message]
    assert starts == ["attempt 2 starts with batch_size=32 (was 64)", "attempt 3 starts with batch_size=16 (was 32)"]


def test_the_changed_parameters_survive_a_daemon_restart(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                         make_job, home: Path) -> None:
    gate = home / "gate"
    # Attempt 2 (at 32) waits for the gate before its OOM: the daemon is killed and restarted meanwhile.
    job = OOM_JOB.replace('if int(batch) > 16:', f'if int(batch) == 32:\n    import os\n'
                          f'    while not os.path.exists("{gate}"):\n        time.sleep(0.02)\nif int(batch) > 16:')
    spec = make_job("kept", job, params=', "{batch_size}"', probes='["python", "tqdm", "cuda"]',
                    extra=FAST_RESTART + '[restart.adjust]\noom = { batch_size = "x0.5" }\n')
    spec.write_text(spec.read_text() + '[params]\nbatch_size = "64"\n')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: len(client.attempts("kept").attempts) == 2
               and client.attempts("kept").attempts[1].state == "running", timeout=30)
    daemon.kill(signal.SIGKILL)  # attempt 2 runs on, detached
    gate.write_text("")
    daemon.start()
    client = daemon.client()
    wait_until(lambda: _ended(client, "kept"), timeout=60)
    attempts = client.attempts("kept").attempts
    # Attempt 3 is worked out from what attempt 2 ran with, as stored: 16, not 64 halved again to 32.
    assert [(a.argv[-1], a.verdict) for a in attempts] == [("64", "oom"), ("32", "oom"), ("16", "done")], \
        [(a.argv[-1], a.verdict, a.reason) for a in attempts]
