"""Judgement against history: a run slower or faster than the earlier one is never stalled while it
moves, and a frozen one is still flagged at its bound.

    .venv/bin/python tests/perf/bench_judgement.py [--step 1.0] [--steps 8] [--configs floor,learned] [--tree DIR]

One real daemon.  Every job is a shard bar of ``--steps`` steps whose pace is read from a file, so
that two runs of one command (one pace history) can go at different speeds.  Each job runs twice:
first at the history's pace (``--step`` seconds a step), then as the row says:

- paced at 0.25x to 4x the history's speed (4x slower to 4x faster), every step alike;
- at the history's speed with one step of 3 x the history's 95th percentile (a slow shard on a shared
  filesystem);
- frozen after half its steps at the history's speed: it must be flagged, at its bound.

Two configurations, side by side: ``floor`` (``stall_floor_s`` = 5 x the step: history may only
loosen it) and ``learned`` (``stall_floor_s`` = 60 and ``learned_min_s`` = 0.5: history tightens the
bound, from the run's first interval on).  A false verdict is any ``stalled`` or ``silent`` verdict
on a healthy row; ``slow`` reports (alerts, never kills) are counted beside.  Prints markdown tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PY, Daemon, machine_note, table, wait_until

STALL_K = 3.0

# argv: the pace file.  It holds the step durations, comma-separated; "freeze" in place of one
# hangs there (the bar never moves again, the process lives on).
PACED_BAR = """\
import sys, time
steps = open(sys.argv[1]).read().split(",")
n = len(steps)
print("starting", flush=True)
for i in range(n + 1):
    print(f"Loading checkpoint shards: {100 * i // n}%|###| {i}/{n} [00:00<00:01, 5.0it/s]", flush=True)
    if i < n:
        if steps[i].strip() == "freeze":
            while True:
                time.sleep(3600)
        time.sleep(float(steps[i]))
print("all good", flush=True)
"""


@dataclass
class Row:
    config: str
    label: str
    steps: list[str]  # the second run's steps
    healthy: bool

    @property
    def name(self) -> str:
        return f"{self.config}-{self.label}".replace(".", "p").replace(" ", "-")


def rows(config: str, step: float, n: int) -> list[Row]:
    found = []
    for speed in (0.25, 0.5, 1.0, 2.0, 4.0):
        found.append(Row(config, f"{speed:g}x", [f"{step / speed:.4f}"] * n, True))
    slow = [f"{step:.4f}"] * n
    slow[n // 2] = f"{3 * step:.4f}"
    found.append(Row(config, "slow step", slow, True))
    frozen = [f"{step:.4f}"] * (n // 2) + ["freeze"] + [f"{step:.4f}"] * (n - n // 2 - 1)
    found.append(Row(config, "frozen", frozen, False))
    return found


def health_of(config: str, step: float) -> str:
    if config == "floor":
        return f"[health]\nstall_floor_s = {5 * step:g}\nstall_k = {STALL_K}\n"
    return f"[health]\nstall_floor_s = 60\nlearned_min_s = 0.5\nstall_k = {STALL_K}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", type=float, default=1.0, help="seconds a step of the history's run")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--configs", default="floor,learned")
    parser.add_argument("--tree", type=Path, metavar="DIR", help="run the daemon of this checkout instead (a tree before a change)")
    args = parser.parse_args()
    configs = args.configs.split(",")
    all_rows = [r for c in configs for r in rows(c, args.step, args.steps)]
    started = time.monotonic()
    with Daemon(tree=args.tree) as daemon:
        script = daemon.home / "paced_bar.py"
        script.write_text(PACED_BAR)
        client = daemon.client()
        specs = {}
        for r in all_rows:
            pace = daemon.home / f"{r.name}.pace"
            pace.write_text(",".join([f"{args.step:.4f}"] * args.steps))
            specs[r.name] = (pace, daemon.spec(r.name, [PY, str(script), str(pace)],
                                               extra=health_of(r.config, args.step)
                                               + "[restart]\nmax_attempts = 1\n"))
        # First run: the history, at the same pace for every row.
        daemon.start_jobs([spec for _, spec in specs.values()])
        daemon.wait_finished(list(specs), timeout=30 + 3 * args.step * args.steps)
        for r in all_rows:
            specs[r.name][0].write_text(",".join(r.steps))
        daemon.start_jobs([spec for _, spec in specs.values()])
        wait_until(lambda: all(len(client.attempts(r.name).attempts) >= 2 for r in all_rows), 60, "second runs")
        daemon.wait_finished([r.name for r in all_rows if r.healthy],
                             timeout=30 + 5 * args.step * args.steps)
        frozen = [r.name for r in all_rows if not r.healthy]
        wait_until(lambda: all(any(e.kind == "verdict" and e.attempt == 2 for e in client.events(n).events)
                               for n in frozen), 120, "frozen runs to be judged")
        out = [["config", "second run", "verdict", "bound (source)", "detection", "detection / bound",
                "slow reports"]]
        false_verdicts = 0
        for r in all_rows:
            events = [e for e in client.events(r.name).events if e.attempt == 2]
            verdict = next((e for e in events if e.kind == "verdict"), None)
            name = verdict.data.get("verdict") if verdict else "-"
            slow = sum(1 for e in events if e.kind == "action" and e.data.get("slow"))
            bound: Any = "-"
            detection: Any = "-"
            ratio: Any = "-"
            if name in ("stalled", "silent"):
                if r.healthy:
                    false_verdicts += 1
                last = max(e.ts for e in events if e.kind == "progress")
                detected = verdict.ts - last
                b = verdict.data.get("bound_s")
                bound = f"{b:.1f}s ({verdict.data.get('bound_source')})" if b else "-"
                detection = f"{detected:.2f}s"
                ratio = f"{detected / b:.2f}x" if b else "-"
            out.append([r.config, r.label, name, bound, detection, ratio, slow])
        print(f"## Judgement against history ({machine_note()}{f'; the daemon of {args.tree}' if args.tree else ''})\n")
        print(f"History: {args.steps} steps at {args.step:g} s; stall_k {STALL_K:g}. "
              f"floor: stall_floor_s = {5 * args.step:g} s; learned: stall_floor_s = 60, learned_min_s = 0.5.\n")
        print(table(out[0], out[1:], "lllrrrr"))
        healthy = sum(1 for r in all_rows if r.healthy)
        print(f"\nfalse stalled/silent verdicts on healthy runs: {false_verdicts} of {healthy}; "
              f"wall {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
