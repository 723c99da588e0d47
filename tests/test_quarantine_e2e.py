"""Keeping away from a bad GPU or host, through real daemons and real job processes: an Xid on
GPU 1 (written to a kernel log the test controls; NVML is the faithful fake at its boundary,
tests/fakes/gpu_daemon.py, with its event set refused as in a container) quarantines GPU 1, and
the relaunch of a `devices = "all"` job sees CUDA_VISIBLE_DEVICES without it; the quarantine is
listed by `supervise quarantine`, `status` and `doctor`, outlives a daemon restart, holds a job
that names GPU 1 until `--clear` lifts it; bad `--clear` values are refused in one line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_until
from e2e_jobs import job_state, supervise
from test_observe_e2e import FakeGpuDaemon

from supervisor.cli import main as cli_main
from supervisor.cli.doctor import _quarantine_checks

# A job that holds memory on both GPUs (the fake lists it there), says which GPUs CUDA would
# see, and, in its first attempt, ends with an error once the test says so (its GPU fell off).
JOB = """import os, sys, time, pathlib
out, job, n = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(out / 'holders' / str(os.getpid())).write_text('0 1000\\n1 1000\\n')
(out / f'cvd-{job}-{n}').write_text(os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))
print('working', flush=True)
if n == '1' and job == 'train':
    while not (out / 'go').exists():
        time.sleep(0.05)
    sys.exit(3)
"""


def _kmsg_record(seq: int, message: str) -> str:
    # /dev/kmsg's record format, in a plain file standing in for the kernel's device (a fake:
    # writing to the real one would put a false Xid in this machine's kernel log).
    return f"3,{seq},{seq * 1000},-;{message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:28:00.0\n"


@pytest.fixture
def gpu_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpuDaemon]:
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    (home / "kmsg").write_text("")
    d = FakeGpuDaemon(home, {**daemon_env, "SUPERVISE_FAKE_GPU_HOLDERS": str(home / "holders"),
                             "SUPERVISE_GPU_INTERVAL_S": "0.2", "SUPERVISE_FAKE_GPU_XID_EVENTS": "0",
                             "SUPERVISE_KERNEL_LOG": str(home / "kmsg")})
    d.start()
    yield d
    d.close()


def _spec(home: Path, name: str, gpu: str = "") -> Path:
    (home / "job.py").write_text(JOB)
    spec = home / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = ["{sys.executable}", "{home / "job.py"}", "{home}", "{{job}}", "{{attempt}}"]\n'
                    "stop_grace_s = 1\n[restart]\nmax_attempts = 3\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n"
                    f"[gpu]\nrelease_timeout_s = 20\n{gpu}")
    return spec


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI's own entry point in this process (SUPERVISE_HOME names the test's daemon): a
    subprocess each would cost seconds of interpreter start on a loaded machine."""
    capsys.readouterr()
    try:
        code = cli_main(list(args))
    except SystemExit as exc:  # argparse's usage error
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # one daemon restart and a relaunch: ~25 s on two loaded cores, six behaviours in one run
@pytest.mark.timeout(180)
def test_an_xid_on_gpu_1_quarantines_it_and_the_relaunch_runs_without_it(
        gpu_daemon: FakeGpuDaemon, home: Path, daemon_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    client = gpu_daemon.client()
    client.start(str(_spec(home, "train")), {})
    wait_until(lambda: (home / "cvd-train-1").exists() and (home / "cvd-train-1").read_text())
    assert (home / "cvd-train-1").read_text() == "<unset>"  # every GPU, as CUDA's default
    wait_until(lambda: any(d.index == 1 and d.processes for d in client.gpus().devices), timeout=20)
    with (home / "kmsg").open("a") as log:
        log.write(_kmsg_record(7, "NVRM: Xid (PCI:0000:28:00): 79, pid='<unknown>', name=<unknown>, "
                                  "GPU has fallen off the bus."))
    wait_until(lambda: client.quarantine().quarantined, timeout=20)
    [held] = client.quarantine().quarantined
    assert (held.place, held.gpu, held.until - held.since) == ("local:1", 1, 3600.0)
    assert "Xid 79" in held.reason
    listed = _cli(capsys, "quarantine")[1]
    assert listed.startswith("quarantined local:1 until ") and "(in 59m" in listed and "fallen off the bus" in listed

    (home / "go").write_text("")  # the attempt on the faulted GPU ends with an error
    wait_until(lambda: job_state(client, "train") == "done", timeout=60)
    assert (home / "cvd-train-2").read_text() == "0"  # relaunched without GPU 1
    moved = [e.message for e in client.events("train", kinds=["action"]).events if "without GPU" in e.message]
    assert len(moved) == 1 and moved[0].startswith("launching without GPU 1: GPU 1 quarantined until ")
    assert moved[0].endswith("CUDA_VISIBLE_DEVICES=0")
    assert "\nquarantined local:1 until " in supervise(daemon_env, "status").stdout
    [doctor] = [check.line() for check in _quarantine_checks(None)]
    assert doctor.startswith("warn     quarantine  quarantined local:1 until ")
    assert doctor.endswith("`supervise quarantine --clear local:1` lifts it")

    gpu_daemon.close()  # a restart keeps the quarantine (the store's table)
    gpu_daemon.start()
    client = gpu_daemon.client()
    assert [q.place for q in client.quarantine().quarantined] == ["local:1"]

    # Bad values: one line each, the README's exit codes, nothing lost, the daemon alive.
    for bad, words in (("", "expected HOST or HOST:GPU"), ("local\n1", "expected HOST or HOST:GPU")):
        code, _, err = _cli(capsys, "quarantine", "--clear", bad)
        assert code == 2 and err.strip().splitlines()[-1].endswith(f"{words} (e.g. local or local:1), got {bad!r}")
    code, _, err = _cli(capsys, "quarantine", "--clear", "ssh://nowhere")
    assert code == 66 and err == ("supervise: nothing quarantined at 'ssh://nowhere' (quarantined now: local:1); "
                                  "`supervise quarantine` lists them\n")
    done = supervise(daemon_env, "quarantine", "--clear", "local:7", check=False)  # the installed command, once
    assert done.returncode == 66 and "nothing quarantined at 'local:7'" in done.stderr
    assert [q.place for q in client.quarantine().quarantined] == ["local:1"] and client.ping()

    # A job that names GPU 1 waits (said at once by `start`) until the quarantine is lifted.
    started = client.start(str(_spec(home, "pinned", "devices = [1]\n")), {}).message
    assert "waiting for GPU 1 quarantined until " in started, started
    assert "`supervise quarantine --clear local:1` launches now" in started
    assert job_state(client, "pinned") == "waiting" and not (home / "cvd-pinned-1").exists()
    code, out, _ = _cli(capsys, "quarantine", "--clear", "local:1")
    assert code == 0 and "quarantine of local:1 lifted (1 entry)" in out and "nothing quarantined" in out
    wait_until(lambda: job_state(client, "pinned") == "done", timeout=30)
    assert (home / "cvd-pinned-1").exists()

    # Every GPU quarantined: a `devices = "all"` job waits too (an empty CUDA_VISIBLE_DEVICES would give it none).
    with (home / "kmsg").open("a") as log:
        for seq, pci in ((8, "18"), (9, "28")):
            log.write(_kmsg_record(seq, f"NVRM: Xid (PCI:0000:{pci}:00): 48, pid=1, name=x, DBE (double bit error)"))
    wait_until(lambda: len(client.quarantine().quarantined) == 2, timeout=20)
    started = client.start(str(_spec(home, "every")), {}).message
    assert "waiting for GPU 0 quarantined until " in started and "; GPU 1 quarantined until " in started, started
    assert "(every GPU of local is; `supervise quarantine --clear local` launches now)" in started
    code, out, _ = _cli(capsys, "quarantine", "--clear", "local")
    assert code == 0 and "quarantine of local lifted (2 entries)" in out
    wait_until(lambda: job_state(client, "every") == "done", timeout=30)
    assert (home / "cvd-every-1").read_text() == "<unset>"
