"""What finding `{last_checkpoint}` costs at a launch: the `checkpoints` glob listed with its completeness
marker, on the local host (in a thread) and on an SSH host (a real sshd on loopback, the resident shell's
script), for a few sizes of checkpoint directory.

    .venv/bin/python tests/perf/bench_checkpoints.py [--rounds 15] [--sizes 10,1000,10000]

Comparators, in the same run: locally, a bare `glob.glob` of the same pattern (no stat, no marker); over
SSH, one `log_stat` (the cheapest operation the daemon already runs on that shell, per attempt).  While
each local listing runs, a ticker on the event loop measures the longest the loop went unanswered, beside
the same ticker over an idle half second (the machine's own noise).  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _harness import percentile
from sshd import SshServer


def _tree(root: Path, n: int) -> None:
    for i in range(1, n + 1):
        path = root / f"step_{i}"
        path.mkdir(parents=True)
        if i < n:  # the newest is half written: no marker
            (path / "COMPLETE").write_text("")


async def _timed_with_lag(make) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    lag = 0.0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal lag
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = max(lag, time.perf_counter() - before - 0.001)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.005)
    start = time.perf_counter()
    result = await make()
    took = time.perf_counter() - start
    done.set()
    await ticker
    return took, lag, result


async def _run(sizes: list[int], rounds: int, base: Path, server: SshServer) -> list[str]:
    from supervisor.hosts.local.host import LocalHost
    from supervisor.hosts.ssh.host import SshHost
    from supervisor.jobs import checkpoints
    from supervisor.spec.model import JobSpec

    env = server.env()
    env["SUPERVISE_SSH_LOG_ROOT"] = str(base / "remote-logs")
    ssh = SshHost(server.url, env=env)
    local = LocalHost(base / "logs")
    rows = []
    try:
        idle = [(await _timed_with_lag(lambda: asyncio.sleep(0.5)))[1] for _ in range(rounds)]
        rows.append(f"| (none: the loop idle 0.5 s) | | | | {1000 * percentile(idle, 50):,.1f} | "
                    f"{1000 * max(idle):,.1f} | | | | |")
        probe = base / "probe.log"
        probe.write_text("x")
        await ssh.log_stat(str(probe))  # the connection and its resident shell, opened once before timing
        for n in sizes:
            root = base / f"n{n}"
            _tree(root, n)
            spec = JobSpec.model_validate({"name": "b", "command": ["x"], "checkpoints": f"{root}/step_*",
                                           "checkpoint_complete": "COMPLETE", "spec_path": str(base / "b.toml")})
            remote = spec.model_copy(update={"host": server.url, "python": "python3", "workdir": str(base)})
            local_s, lags, bare_s, ssh_s, stat_s = [], [], [], [], []
            for _ in range(rounds):
                took, lag, listing = await _timed_with_lag(lambda spec=spec: checkpoints.list_complete(local, spec))
                assert len(listing.complete) == n - 1  # type: ignore[attr-defined]
                local_s.append(took)
                lags.append(lag)
                start = time.perf_counter()
                glob.glob(f"{root}/step_*")
                bare_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                listing = await checkpoints.list_complete(ssh, remote)
                ssh_s.append(time.perf_counter() - start)
                assert len(listing.complete) == n - 1
                start = time.perf_counter()
                await ssh.log_stat(str(probe))
                stat_s.append(time.perf_counter() - start)

            def ms(values: list[float], q: float) -> str:
                return f"{1000 * percentile(values, q):,.1f}"

            rows.append(f"| {n:,} | {ms(local_s, 50)} | {ms(local_s, 90)} | {ms(bare_s, 50)} | {ms(lags, 50)} | "
                        f"{ms(lags, 100)} | {ms(ssh_s, 50)} | {ms(ssh_s, 90)} | {ms(stat_s, 50)} | "
                        f"{percentile(ssh_s, 50) / percentile(stat_s, 50):,.1f}x |")
    finally:
        await ssh.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", default="10,1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="svck-") as tmp:
        base = Path(tmp)
        os.environ["SUPERVISE_HOME"] = str(base / "home")
        os.environ["HOME"] = str(base)  # ~/.ssh is never read
        os.environ.pop("SSH_AUTH_SOCK", None)
        server = SshServer(base / "sshd").start()
        try:
            rows = asyncio.run(_run(sizes, args.rounds, base, server))
        finally:
            server.stop()
    print(f"{args.rounds} rounds each; load average {os.getloadavg()[0]:.1f}")
    print("| checkpoints | local p50 ms | local p90 ms | bare glob p50 ms | loop lag p50 ms | loop lag max ms "
          "| SSH p50 ms | SSH p90 ms | one log_stat p50 ms | SSH / log_stat |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
