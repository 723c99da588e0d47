"""`[limits]` end to end through a real daemon and the real CLI.

Where the machine gives attempts no cgroup v2 with the memory, cpu and pids controllers (this one:
cgroup v1 holds them), `start` refuses a spec with limits in one line, exit 69, and stores nothing.
Where it does (the daemon's own cgroup has them enabled below it, or the setting cgroup_root names a
delegated cgroup without processes: `SUPERVISE_CGROUP_ROOT` in the environment reaches the daemon),
the kernel enforces them: a job over its memory limit is judged `oom` with the figure, one refused a
thread by its task limit `limit`, and one held to half a core gets half a core; each attempt's
cgroup is removed once it ends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

from supervisor.core.resource_limits import Controller
from supervisor.hosts.local import cgroup

_ROOT = os.environ.get("SUPERVISE_CGROUP_ROOT") or None
HERE = cgroup.detect(base=Path(_ROOT) if _ROOT else None)
LIMITS_HERE = HERE.controllers == frozenset(Controller)
needs_limits = pytest.mark.skipif(not LIMITS_HERE, reason=f"no cgroup v2 controllers for limits here: {HERE.limits_note}")

MEMORY_HOG = """\
import time
chunks = []
for i in range(64):  # 512 MiB in 8 MiB pieces, each page touched: resident, not just reserved
    chunks.append(b"x" * (8 << 20))
    print(f"allocated {(i + 1) * 8} MiB", flush=True)
    time.sleep(0.02)
print("never reached", flush=True)
"""

THREAD_HOG = """\
import threading, time
stop = threading.Event()
for i in range(64):
    threading.Thread(target=stop.wait, daemon=True).start()
    print(f"thread {i + 1} started", flush=True)
"""

CPU_SPINNER = """\
import time
wall, cpu = time.monotonic(), time.process_time()
while time.monotonic() - wall < 3.0:
    pass
print(f"cpu share {(time.process_time() - cpu) / (time.monotonic() - wall):.2f} of one core", flush=True)
"""


def _spec(make_job, name: str, script: str, limits: str) -> Path:
    spec = make_job(name, script, probes='["python"]')
    spec.write_text(spec.read_text().replace("stop_grace_s = 2\n", "stop_grace_s = 2\n[restart]\nmax_attempts = 1\n"
                                             f"[limits]\n{limits}\n", 1))
    return spec


@pytest.mark.skipif(LIMITS_HERE, reason="this machine gives attempts the limits' controllers: nothing to refuse")
def test_start_refuses_limits_in_one_line_where_the_machine_cannot_enforce_them(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job) -> None:
    spec = _spec(make_job, "capped", "print('hi')\n", 'memory_max = "512M"\ntasks_max = 64')
    result = supervise(daemon_env, "start", str(spec), check=False)
    message = result.stderr.strip()
    assert result.returncode == 69, result  # EX_UNAVAILABLE: the spec is sound, this host lacks the means
    assert len(message.splitlines()) == 1, message
    # Which controllers are missing depends on the machine (here: all of them): the line names them.
    missing = [c.value for c in Controller if c in {Controller.MEMORY, Controller.PIDS} - HERE.controllers]
    assert message.startswith(f"supervise: could not start capped: [limits] needs a writable cgroup v2 with the "
                              f"{', '.join(missing)} controller"), message
    assert f"for attempts on host local ({HERE.limits_note}); " in message, message
    assert "remove [limits]" in message and "Delegate=yes" in message and "cgroup_root" in message
    client = daemon.client()
    assert client.ping() is not None and not client.status().jobs  # the daemon lives on; nothing stored or run
    # The same spec without its limits starts: only the limits were refused.
    spec.write_text(spec.read_text().split("[limits]")[0])
    supervise(daemon_env, "start", str(spec))
    wait_until(lambda: job_state(client, "capped") == "done", timeout=30)


@needs_limits
def test_the_kernel_enforces_limits_and_the_verdict_gives_the_figure(
        daemon: DaemonProcess, daemon_env: dict[str, str], make_job) -> None:
    client = daemon.client()
    started = time.monotonic()
    for name, script, limits in (("hog", MEMORY_HOG, 'memory_max = "64M"'),
                                 ("threads", THREAD_HOG, "tasks_max = 8"),
                                 ("spinner", CPU_SPINNER, 'cpu_max = "50%"')):
        supervise(daemon_env, "start", str(_spec(make_job, name, script, limits)))
    for name in ("hog", "threads", "spinner"):
        wait_until(lambda name=name: job_state(client, name) not in ("starting", "running"), timeout=60)
    hog = client.attempts("hog").attempts[-1]
    print(f"hog: {hog.verdict}: {hog.reason}")
    assert hog.verdict == "oom" and "killed by its memory limit 64 MiB (memory.events oom_kill " in (hog.reason or "")
    threads = client.attempts("threads").attempts[-1]
    print(f"threads: {threads.verdict}: {threads.reason}")
    assert threads.verdict == "limit" and "its task limit 8 (pids.events max " in (threads.reason or ""), threads
    assert "limit is not a verdict to relaunch on" in (threads.action or "")
    spinner = client.attempts("spinner").attempts[-1]
    share = supervise(daemon_env, "logs", "spinner").stdout.strip().splitlines()[-1]
    print(f"spinner: {spinner.verdict}; {share}; all three judged in {time.monotonic() - started:.1f}s")
    assert spinner.verdict == "done" and float(share.split()[2]) < 0.7, share  # half a core, not a whole one
    judged = [e for e in client.events("spinner").events if e.kind == "verdict"][-1]
    print(f"spinner: held back {judged.data.get('cpu_throttled_s')} s by cpu_max")
    assert judged.data["cpu_throttled_s"] > 0.5, judged.data  # a 3 s spin at half a core: ~1.5 s held back
    shown = supervise(daemon_env, "status", "hog", check=False).stdout
    print(shown)
    assert "its memory limit 64 MiB" in shown, shown
    listed = supervise(daemon_env, "attempts", "threads").stdout
    assert "its task limit 8 (pids.events max " in listed, listed
    assert HERE.root is not None
    wait_until(lambda: not [g for g in HERE.root.iterdir() if g.is_dir() and not g.name.startswith("probe-")],
               timeout=10)  # every attempt's cgroup removed once it ended
