"""Crash latency: a job's process exits -> its attempt judged crashed, with the traceback attached.

    .venv/bin/python tests/perf/bench_crash.py [--crashes 20] [--quick]

One real daemon; ``--crashes`` jobs (distinct names, ``max_attempts = 1``), run one after the
other.  Each is tests/perf/_crasher.py: a few stamped lines, then an uncaught RuntimeError,
whose traceback Python writes to the log before exiting 1.  For each crash:

- job exit, two ways that bracket it: this benchmark holds a pidfd on the job's Python
  process and stamps ``time.time()`` when it becomes readable (the process has exited by
  then; this benchmark's own wake-up can be late on a busy machine, which makes the
  latency look shorter); and the job's own atexit handler, run after Python has printed
  the traceback, writes ``time.time()`` to a side file (interpreter teardown still
  follows, which makes the latency look longer);
- last write: the stamp on the last line the job wrote before raising;
- the daemon's ``exited`` and ``verdict`` events: their ``ts`` (set when the event object is
  created, just before the transaction that stores it commits);
- context: the launch wrapper's exit, seen the same way (it writes the exit-status file
  after the job ends, then exits: that exit is what the daemon waits for), and how long
  the daemon waited for a CPU while each crash was handled (run-queue delay from
  /proc/PID/schedstat, from before the exit until the job was finished).

It checks that each verdict is ``crashed`` and that the attempt carries the traceback.
Prints a markdown table of p50/p99/max.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from _harness import (
    PERF,
    PY,
    Daemon,
    machine_note,
    ms,
    percentile,
    stamp_of,
    table,
    wait_until,
)

CRASHER = PERF / "_crasher.py"


def job_process(wrapper_pid: int) -> psutil.Process:
    def find() -> psutil.Process | None:
        try:
            for child in psutil.Process(wrapper_pid).children(recursive=True):
                if str(CRASHER) in " ".join(child.cmdline()):
                    return child
        except psutil.Error:
            return None
        return None

    return wait_until(find, 5, "the crashing job's process", interval=0.005)  # type: ignore[return-value]


def wait_exits(pids: list[int]) -> list[float | None]:
    """Stamp the moment each process exits (a pidfd becomes readable when it has)."""
    stamps: list[float | None] = [None] * len(pids)
    fds: dict[int, int] = {}
    poller = select.poll()
    for index, pid in enumerate(pids):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # already gone: no exit stamp for this one
        fds[fd] = index
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + 30
    try:
        while len([s for s in stamps if s is not None]) < len(fds) and time.monotonic() < deadline:
            for fd, _ in poller.poll(1000):
                now = time.time()
                poller.unregister(fd)
                stamps[fds[fd]] = now
    finally:
        for fd in fds:
            os.close(fd)
    return stamps


def run_delay(pid: int) -> float:
    """Seconds the process has spent runnable but waiting for a CPU (Linux schedstat)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crashes", type=int, default=20, help="how many crashing jobs (default 20)")
    parser.add_argument("--lines", type=int, default=5, help="lines each job writes before raising (default 5)")
    parser.add_argument("--quick", action="store_true", help="10 crashes")
    parser.add_argument("--keep", action="store_true", help="keep the daemon's state directory")
    args = parser.parse_args()
    if args.quick:
        args.crashes = min(args.crashes, 10)

    print(machine_note())
    rows: list[dict[str, float | None]] = []
    delays: list[float] = []
    attached = crashed = 0
    with Daemon(keep=args.keep) as daemon:
        client = daemon.client()
        db = daemon.db()
        for i in range(args.crashes):
            name = f"crash-{i:02d}"
            exit_file = daemon.home / f"{name}.exit"
            spec = daemon.spec(name, [PY, str(CRASHER), name, "--lines", str(args.lines), "--exit-stamp", str(exit_file)],
                               extra="[restart]\nmax_attempts = 1\n")
            started = client.start(str(spec), {})
            wrapper = client.attempts(name).attempts[0].pid
            assert wrapper is not None
            job = job_process(wrapper)
            delay0 = run_delay(daemon.pid)
            job_exit, wrapper_exit = wait_exits([job.pid, wrapper])
            daemon.wait_finished([name], timeout=30)
            delay = run_delay(daemon.pid) - delay0
            exit_at = float(exit_file.read_text()) if exit_file.exists() else None
            attempt = client.attempts(name).attempts[0]
            events = dict(db.execute("SELECT kind, ts FROM events WHERE job=? AND kind IN ('exited', 'verdict')",
                                     (name,)).fetchall())
            lines = Path(started.log_path).read_text(errors="replace").splitlines()
            last = max((s for s in map(stamp_of, lines) if s is not None), default=None)
            crashed += attempt.verdict == "crashed"
            attached += bool(attempt.failure and attempt.failure.traceback and "RuntimeError" in attempt.failure.traceback)
            delays.append(delay)
            rows.append({"exit": exit_at, "pidfd": job_exit, "wrapper": wrapper_exit, "last": last,
                         "exited": events.get("exited"), "verdict": events.get("verdict")})
        db.close()

    def deltas(a: str, b: str) -> list[float]:
        return [r[b] - r[a] for r in rows if r[a] is not None and r[b] is not None]  # type: ignore[operator]

    spans = [
        ("job exit seen here (pidfd) -> `verdict` event (crashed)", deltas("pidfd", "verdict")),
        ("job exit (its atexit stamp) -> `verdict` event (crashed)", deltas("exit", "verdict")),
        ("job exit seen here (pidfd) -> `exited` event", deltas("pidfd", "exited")),
        ("`exited` event -> `verdict` event", deltas("exited", "verdict")),
        ("last line written -> `verdict` event", deltas("last", "verdict")),
        ("context: last line written -> atexit stamp (traceback printed)", deltas("last", "exit")),
        ("context: atexit stamp -> job exit seen here (interpreter teardown)", deltas("exit", "pidfd")),
        ("context: job exit -> wrapper exit, both seen here", deltas("pidfd", "wrapper")),
        ("context: wrapper exit seen here -> `exited` event", deltas("wrapper", "exited")),
        ("context: daemon's run-queue wait while handling the crash", delays),
    ]
    print(f"\n{len(rows)} crashes, one job at a time: verdict `crashed` {crashed}/{len(rows)}, "
          f"traceback attached to the attempt {attached}/{len(rows)}\n")
    print(table(["span", "n", "p50 ms", "p99 ms", "max ms"],
                [[label, len(v), ms(percentile(v, 50)), ms(percentile(v, 99)), ms(max(v, default=float("nan")))]
                 for label, v in spans]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
