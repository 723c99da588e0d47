"""Stall detection on paced replays of real logs: how soon, against the bound, and never wrongly.

    .venv/bin/python tests/perf/bench_stall.py [--floors 0.1,0.5,1,2] [--speeds 1,2]
                                               [--corpus-floors 0.5,1,2] [--interval 0.01] [--quick] [--tree DIR]

One real daemon replays, with tests/jobs/replay.py, the vLLM 0.23 ``serve`` log whose shard
loading was frozen for 45 s at 5/13 (tests/data/pacing: its real arrival times, divided by
``--speed``, pauses over 0.5 s collapsed to 0.1 s as in tests/test_health_e2e.py):

- frozen: ``--freeze-after 42`` stops the replay right after the 5/13 line and hangs.  For
  each floor and speed: detection = the ``stalled`` verdict's ``ts`` - the ``ts`` of the last
  progress event of the stalled bar, against the bound the design promises,
  ``max(stall_floor_s, stall_k x median interval)``, with the median taken here from the
  same bar's stored progress events (stall_k = 3, the default).  Ratio = detection / bound:
  1.00x means flagged exactly at the bound; below 1 would be early (wrong).
- history: every frozen job has ``max_attempts = 2``, so it is relaunched once; the relaunch starts
  from the first attempt's stored shard intervals (``PaceHistory``).  Every spec here sets
  ``learned_min_s`` (a tenth of its floor), which lets history tighten the bound below the floor
  (without it history only loosens: see bench_judgement.py).  Side by side: each attempt's
  bound (the verdict's ``bound_s`` and ``bound_source``) and detection, and when the ``slow``
  report came (after the last shard) on the relaunch, before its stall.
- healthy: the same log, not frozen (the 45 s freeze collapsed like every other pause): it
  must never be flagged.  A floor shorter than one shard's load time would flag it by
  design (until a first interval is measured, the floor alone is the bound), so a
  (speed, floor) pair whose floor is under 1.5x one shard's time at that speed is skipped
  and listed.
- corpus: every log of tests/data/corpus/full-logs replayed line by line every
  ``--interval`` seconds, once per ``--corpus-floors`` value: none may be flagged either.

  Each healthy job is started twice: its second run has the first's history.

All runs of a group run at once (distinct job names).  A false positive is any ``stalled`` or
``silent`` verdict, or a ``slow`` report, on a healthy replay.  Prints markdown tables.
``--tree DIR``: the daemon of another checkout runs it (a tree before a change, run back to back
with this one's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

from _harness import PACKS, PY, ROOT, Daemon, machine_note, ms, table, wait_until

REPLAY = ROOT / "tests" / "jobs" / "replay.py"
PACING = ROOT / "tests" / "data" / "pacing" / "vllm-0.23-6.7b-serve-stall-at-5of13.arrivals.tsv"
FULL_LOGS = ROOT / "tests" / "data" / "corpus" / "full-logs"
STALL_K = 3.0
UNHEALTHY = ("stalled", "silent")


@dataclass
class Run:
    name: str
    argv: list[str]
    floor: float
    label: str


def shard_interval() -> float:
    """Median seconds between shard-bar lines in the recording (real pacing, before --speed)."""
    stamps = [float(line.split("\t", 1)[0]) for line in PACING.read_text(encoding="utf-8").splitlines()
              if "checkpoint shards:" in line and not line.startswith("#")]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps))


def job_name(*parts: object) -> str:
    return "-".join(str(p).replace(".", "p") for p in parts)


def run_group(daemon: Daemon, runs: list[Run], timeout: float, *, attempts: int = 1,
              runs_each: int = 1) -> dict[str, dict[str, Any]]:
    """``attempts``: max_attempts (a frozen job is relaunched); ``runs_each``: start each job again
    once it has finished, this many times in all (each later run has the earlier runs' history)."""
    restart = f"max_attempts = {attempts}\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n"
    specs = [daemon.spec(r.name, r.argv, probes=PACKS,
                         extra=f"[health]\nstall_floor_s = {r.floor}\nlearned_min_s = {r.floor / 10:g}\n"
                               f"stall_k = {STALL_K}\n[restart]\n{restart}")
             for r in runs]
    client = daemon.client()
    for n in range(1, runs_each + 1):
        daemon.start_jobs(specs)
        wait_until(lambda n=n: all(len(client.attempts(r.name).attempts) >= n for r in runs), timeout,
                   "runs to start")
        daemon.wait_finished([r.name for r in runs], timeout)
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        events = client.events(r.name).events
        verdicts = [e for e in events if e.kind == "verdict"]
        out[r.name] = {"events": events, "verdict": verdicts[-1] if verdicts else None,
                       "verdicts": verdicts, "attempt": client.attempts(r.name).attempts[-1]}
    return out


def stall_of(result: dict[str, Any], attempt: int) -> tuple[Any, float] | None:
    """The attempt's ``stalled`` verdict and its detection time: its ``ts`` - the last advance's."""
    verdict = next((v for v in result["verdicts"] if v.attempt == attempt and v.data.get("verdict") == "stalled"), None)
    if verdict is None:
        return None
    probe = verdict.data.get("probe")
    bar = [e for e in result["events"] if e.attempt == attempt and e.kind == "progress" and e.probe == probe
           and e.ts <= verdict.ts]
    advances, last_done = [], None
    for e in bar:
        done = e.data.get("done")
        if last_done is None or (done is not None and done > last_done):
            advances.append(e.ts)
            last_done = done
    return verdict, verdict.ts - advances[-1]


def frozen_row(run: Run, result: dict[str, Any]) -> list[object]:
    first, second = stall_of(result, 1), stall_of(result, 2)
    if first is None or second is None:
        got = "; ".join(v.message for v in result["verdicts"]) or "no verdict"
        return [run.label, f"{run.floor:g}", "-", "-", "-", "-", "-", "-", f"NOT FLAGGED TWICE: {got}"]
    (v1, d1), (v2, d2) = first, second
    slow = next((e for e in result["events"] if e.attempt == 2 and e.kind == "action" and e.data.get("slow")), None)
    slow_after = ms(slow.ts - (v2.ts - d2)) if slow is not None and slow.ts <= v2.ts else "none"
    where = f"{v2.data.get('probe')} {v2.data.get('done')}/{v2.data.get('total')}"
    return [run.label, f"{run.floor:g}", f"{ms(v1.data['bound_s'])} ({v1.data.get('bound_source')})", ms(d1),
            f"{ms(v2.data['bound_s'])} ({v2.data.get('bound_source')})", ms(d2), f"{d2 / d1:.2f}x",
            slow_after, where]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--floors", default="2,5,10", help="stall_floor_s values for the stall log (default 2,5,10)")
    parser.add_argument("--speeds", default="0.25,0.5,1,2", help="replay speed-ups of the real pacing (default 0.25,0.5,1,2)")
    parser.add_argument("--corpus-floors", default="0.5,1,2", help="stall_floor_s values for the corpus (default 0.5,1,2)")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between corpus lines (default 0.01)")
    parser.add_argument("--quick", action="store_true", help="speeds 1,2; floors 0.25,1; corpus floor 0.5 (about 20 s)")
    parser.add_argument("--keep", action="store_true", help="keep the daemon's state directory")
    parser.add_argument("--tree", type=Path, metavar="DIR", help="run the daemon of this checkout instead")
    args = parser.parse_args()
    if args.quick:
        args.speeds, args.floors, args.corpus_floors = "1,2", "2,5", "0.5"
    floors = [float(f) for f in args.floors.split(",") if f]
    speeds = [float(s) for s in args.speeds.split(",") if s]
    corpus_floors = [float(f) for f in args.corpus_floors.split(",") if f]
    logs = sorted(FULL_LOGS.glob("*.log"))

    print(machine_note() + (f"; the daemon of {args.tree}" if args.tree else ""))
    base = [PY, str(REPLAY), str(PACING), "--arrivals", str(PACING), "--collapse-gaps-over", "0.5"]
    shard_s = shard_interval()
    combos = [(s, f) for s in speeds for f in floors if f >= 1.5 * shard_s / s]
    skipped = [f"x{s:g} floor {f:g}" for s in speeds for f in floors if (s, f) not in combos]
    frozen = [Run(job_name("frozen", s, f), [*base, "--speed", f"{s:g}", "--freeze-after", "42"], f, f"x{s:g}")
              for s, f in combos]
    healthy = [Run(job_name("healthy", s, f), [*base, "--speed", f"{s:g}"], f, f"stall log, not frozen, x{s:g}")
               for s, f in combos]
    corpus = [Run(job_name("corpus", f, p.stem[:2]), [PY, str(REPLAY), str(p), "--interval", f"{args.interval:g}"], f,
                  p.name) for f in corpus_floors for p in logs]
    wall = time.monotonic()
    with Daemon(keep=args.keep, tree=args.tree) as daemon:
        results = run_group(daemon, frozen, timeout=180, attempts=2)
        results.update(run_group(daemon, healthy, timeout=180, runs_each=2))
        results.update(run_group(daemon, corpus, timeout=180))
    wall = time.monotonic() - wall

    print(f"\nshard interval in the recording: {shard_s * 1000:.0f} ms (median); combinations skipped because the "
          f"floor is under 1.5x one shard's load time at that speed: {', '.join(skipped) or 'none'}")
    print(f"\nFrozen at 5/13, twice (a job of max_attempts 2: the relaunch has the first attempt's shard "
          f"intervals): each attempt's bound (source) and detection; {len(frozen)} jobs at once\n")
    print(table(["replay speed", "floor s", "1st run bound ms", "1st run detection ms", "2nd run bound ms",
                 "2nd run detection ms", "2nd / 1st", "slow report after ms", "flagged at"],
                [frozen_row(r, results[r.name]) for r in frozen], align="lrlrlrrrl"))

    def false_positives(group: list[Run]) -> tuple[int, list[str]]:
        flagged = []
        for r in group:
            for e in results[r.name]["events"]:
                if (e.kind == "verdict" and e.data.get("verdict") in UNHEALTHY) or (
                        e.kind == "action" and e.data.get("slow")):
                    flagged.append(f"{r.label} (floor {r.floor:g}, attempt {e.attempt}): {e.message}")
        return len(flagged), flagged

    print("\nHealthy replays: false positives (stalled or silent verdicts, slow reports), must be 0\n")
    rows = []
    for title, group in (((f"stall log, not frozen, gaps > 0.5 s collapsed, each run twice (speeds {args.speeds}, "
                           f"floors {args.floors})"), healthy),
                         *((f"full-logs corpus, {len(logs)} logs, a line every {args.interval:g} s, floor {f:g} s",
                            [r for r in corpus if r.floor == f]) for f in corpus_floors)):
        count, flagged = false_positives(group)
        verdicts = sorted({(results[r.name]["verdict"].data.get("verdict") if results[r.name]["verdict"] else "none")
                           for r in group})
        runs = sum(results[r.name]["attempt"].n for r in group)  # attempts: a healthy job's runs
        rows.append([title, runs, count, ", ".join(verdicts), "; ".join(flagged) or "-"])
    print(table(["healthy replays", "runs", "false positives", "verdicts seen", "flagged"], rows, align="lrrll"))
    total = sum(r[2] for r in rows)
    print(f"\nfalse positives in all: {total} ({'none' if total == 0 else 'SEE ABOVE'}); wall {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
