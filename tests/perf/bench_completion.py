"""What one Tab costs: `supervise jobs --names`, which shell completion runs on every Tab, now and at an older
revision, with no daemon and with a daemon that knows N jobs.

Each case runs the console script's module (`supervise_entry.py`, as the installed `supervise` does) in a fresh
interpreter, R times; it prints the median and p90 of wall time and of the child's CPU (user + system, from
getrusage), and how many daemons the calls left running (each is stopped after it is counted).

    .venv/bin/python tests/perf/bench_completion.py [--before 486a804] [--jobs 20] [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import psutil
from _harness import PY, ROOT, Daemon, machine_note, percentile, table


def _daemons_in(home: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "supervisor.daemon.process" in (proc.info["cmdline"] or []) and \
                    proc.environ().get("SUPERVISE_HOME") == str(home):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _measure(tree: Path, home: Path, runs: int) -> tuple[list[float], list[float], int]:
    walls, cpus, spawned = [], [], 0
    present = {proc.pid for proc in _daemons_in(home)}  # the daemon the case runs beside is not a spawned one
    env = {**os.environ, "SUPERVISE_HOME": str(home), "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": ""}
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([PY, str(tree / "supervise_entry.py"), "jobs", "--names"], env=env, cwd=tree,
                       capture_output=True, timeout=120, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        for proc in (p for p in _daemons_in(home) if p.pid not in present):  # counted, then stopped for the next run
            spawned += 1
            proc.kill()
            proc.wait(10)
    return walls, cpus, spawned


def _row(label: str, result: tuple[list[float], list[float], int]) -> list[str]:
    walls, cpus, spawned = result
    return [label, f"{statistics.median(walls) * 1e3:.0f}", f"{percentile(walls, 90) * 1e3:.0f}",
            f"{statistics.median(cpus) * 1e3:.0f}", f"{percentile(cpus, 90) * 1e3:.0f}", str(spawned)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="486a804", help="the revision to compare with (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=20, help="jobs the running daemon knows")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(machine_note())
    old = Path(tempfile.mkdtemp(prefix="svc-old-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), args.before], check=True)
    rows = []
    try:
        for label, tree in ((f"before ({args.before})", old), ("now", ROOT)):
            empty = Path(tempfile.mkdtemp(prefix="svc-", dir="/tmp"))
            rows.append(_row(f"{label}, no daemon", _measure(tree, empty, args.runs)))
            shutil.rmtree(empty, ignore_errors=True)
        with Daemon() as daemon:
            specs = [daemon.spec(f"job-{i:03d}", [PY, "-c", "pass"]) for i in range(args.jobs)]
            daemon.start_jobs(specs)
            daemon.wait_finished([f"job-{i:03d}" for i in range(args.jobs)], timeout=300)
            for label, tree in ((f"before ({args.before})", old), ("now", ROOT)):
                rows.append(_row(f"{label}, daemon with {args.jobs} jobs", _measure(tree, daemon.home, args.runs)))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    print(f"`supervise jobs --names`, {args.runs} runs a case (ms; CPU = the child's user + system)")
    print(table(["case", "wall p50", "wall p90", "CPU p50", "CPU p90", "daemons started"], rows))


if __name__ == "__main__":
    main()
