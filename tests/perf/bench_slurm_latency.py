"""Slurm host latencies against a real single-node Slurm (tests/slurm.py): submit -> first
record read from the attempt's log, and scancel -> exit seen.

    .venv/bin/python tests/perf/bench_slurm_latency.py [--rounds 5] [--poll 0.5]

Each round submits one attempt through ``SlurmHost.launch`` (sbatch) whose command prints a
line and sleeps; "submit -> first record" runs from just before sbatch to the follower's first
batch (Slurm's scheduling and the job's start included).  Then ``kill_tree`` (scancel --batch
--signal=TERM, the batch script passes it on) and "scancel -> exit seen" runs to the return of
``wait_exit`` (the exit file, then Slurm's final state).  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from slurm import SlurmCluster

from supervisor.hosts.base import LaunchRequest
from supervisor.hosts.slurm.host import SlurmHost

_JOB = "import time; print('ready', flush=True); time.sleep(600)"


async def one_round(host: SlurmHost, root: Path, n: int) -> tuple[float, float]:
    log_path, status_path = await host.log_paths("bench", n)
    request = LaunchRequest(argv=[sys.executable, "-c", _JOB], workdir=str(root), env={}, log_path=log_path,
                            status_path=status_path, tag=f"bench.{n}")
    start = time.monotonic()
    handle = await host.launch(request)
    follower = host.follow(log_path, 0)
    async for _batch in follower.records():
        break
    first = time.monotonic() - start
    await follower.aclose()
    exit_task = asyncio.create_task(host.wait_exit(handle))
    stop = time.monotonic()
    await host.kill_tree(handle, 10.0)
    await exit_task
    return first, time.monotonic() - stop


async def main_async(rounds: int, poll: float) -> None:
    root = Path(tempfile.mkdtemp(prefix="sv-bench-slurm-", dir="/tmp"))
    with SlurmCluster() as cluster:
        os.environ.update(cluster.env())
        os.environ["SUPERVISE_SLURM_POLL_S"] = str(poll)
        host = SlurmHost(f"slurm:?log_root={root / 'logs'}")
        firsts, exits = [], []
        for n in range(1, rounds + 1):
            first, seen = await one_round(host, root, n)
            firsts.append(first)
            exits.append(seen)
    print(f"Slurm 22.05 single node, {rounds} rounds, state polled every {poll}s\n")
    print("| latency | median | max |\n|---|---|---|")
    for name, values in (("submit -> first record", firsts), ("scancel -> exit seen", exits)):
        print(f"| {name} | {statistics.median(values):.2f} s | {max(values):.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    asyncio.run(main_async(args.rounds, args.poll))


if __name__ == "__main__":
    main()
