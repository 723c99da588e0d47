"""Detection latency over SSH: a line written by a job -> its event stored, for a job on
`ssh://` (a real sshd on loopback) beside the same job on the local host, in one run.

    .venv/bin/python tests/perf/bench_ssh_latency.py [--rate 50] [--seconds 5] [--rounds 2]

One real daemon (``python -m supervisor.daemon.process``) in a temporary SUPERVISE_HOME; one real
OpenSSH server (tests/sshd.py: /usr/sbin/sshd on 127.0.0.1, its own keys).  Each round runs a
writer job locally and then the same job over SSH: it writes ``--rate`` lines a second for
``--seconds``, each a transformers shard bar starting with the ``time.time()`` taken just
before the write (one write and a flush per line), which the ``transformers`` pack turns into
a progress event.

Latency = the stored event's ``ts`` (set when the daemon makes the event, just before the
transaction that stores it) - the writer's stamp; same machine, same clock.  Over SSH the
path is: the remote ``tail -F`` (inotify) -> sshd -> the SSH channel -> asyncssh -> the
follower -> probes -> store.  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _harness import percentile
from sshd import SshServer

from supervisor.cli.client import Client
from supervisor.core.config import Paths

WRITER = """\
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
n = max(1, int(rate * seconds))
out = sys.stdout.buffer
start = time.time() + 0.2
for i in range(n):
    due = start + i / rate
    delay = due - time.time()
    if delay > 0:
        time.sleep(delay)
    done = i + 1
    pct = 100 * done // n
    out.write(f"{time.time():.6f} Loading checkpoint shards: {pct:3d}%|###| {done}/{n} [00:05<00:05,  1.00s/it]\\n".encode())
    out.flush()
"""


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark gave up waiting {timeout:.0f}s for {what}")
        time.sleep(0.05)


def run_job(client: Client, home: Path, name: str, host: str, rate: float, seconds: float) -> list[float]:
    spec = home / "specs" / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "{name}"
        host = "{host}"
        command = ["{sys.executable}", "{home / 'specs' / 'writer.py'}", "{rate}", "{seconds}"]
        probes = ["transformers"]
        stop_grace_s = 1
        [env]
        SUPERVISE_HOME = "{home}"
        """))
    client.start(str(spec), {})
    wait_until(lambda: client.status(name).jobs[0].state in ("done", "failed", "stopped"), seconds + 60, f"{name} to end")
    state = client.status(name).jobs[0].state
    if state != "done":
        raise SystemExit(f"{name} ended {state}: {client.status(name).jobs[0].reason}")
    latencies = []
    for event in client.events(name).events:
        if event.kind != "progress":
            continue
        try:
            stamp = float(event.message.split(" ", 1)[0])
        except ValueError:
            continue
        latencies.append(event.ts - stamp)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0, help="lines per second (default 50)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each writer writes (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="local-then-SSH rounds (default 2)")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="svs-", dir="/tmp"))
    (home / "specs").mkdir()
    (home / "specs" / "writer.py").write_text(WRITER)
    load = os.getloadavg()
    server = SshServer(home / "sshd").start()
    env = dict(os.environ)
    env.update(server.env())
    env.pop("SSH_AUTH_SOCK", None)
    env.update({"SUPERVISE_HOME": str(home), "SUPERVISE_SSH_LOG_ROOT": str(home / "remote-logs"),
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    log = open(home / "daemon.out", "ab")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen([sys.executable, "-m", "supervisor.daemon.process"], env=env, cwd=str(ROOT),
                              stdout=log, stderr=log, start_new_session=True)
    results: dict[str, list[float]] = {"local": [], "ssh": []}
    try:
        client = Client(Paths(home), timeout_s=120)
        wait_until(lambda: client.accepting() and client.ping() is not None, 20, "the daemon")
        for r in range(args.rounds):
            results["local"] += run_job(client, home, f"local{r}", "local", args.rate, args.seconds)
            results["ssh"] += run_job(client, home, f"ssh{r}", server.url, args.rate, args.seconds)
        client.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        server.stop()
        shutil.rmtree(home, ignore_errors=True)

    print(f"Detection latency, line written -> event stored ({args.rounds} round(s) of {args.seconds:g} s at "
          f"{args.rate:g} lines/s per host; SSH over loopback to a local sshd)\n")
    print("| host | events | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, label in (("local", "local (inotify)"), ("ssh", "ssh://127.0.0.1 (tail -F over SSH)")):
        values = results[name]
        print(f"| {label} | {len(values)} | {ms(percentile(values, 50))} | {ms(percentile(values, 90))} | "
              f"{ms(percentile(values, 99))} | {ms(max(values) if values else math.nan)} |")
    print(f"\nmachine: nproc {os.cpu_count()}, kernel {platform.release()}, Python {platform.python_version()}, "
          f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
