"""Ended attempts under load: is each one judged on its whole log?

    .venv/bin/python tests/perf/bench_ended_reading.py [--jobs 50] [--rate 2000] [--seconds 60] [--settle 20]

One real daemon; ``--jobs`` jobs started together, each a tqdm bar redrawn ``--rate`` times a second
(carriage returns, as tqdm writes to a file) for ``--seconds``, then an uncaught KeyError: its
traceback is the last thing in the log, and the process exits 1.  The daemon reads all of them at
once and cannot keep up on a small machine: when the jobs end, most of each log is still unread.

For every attempt, once every job is judged, it prints whether its log was read to its end: the
stored offset against the log's size, and the traceback (the log's last lines) recognised (the
stored offset alone can overstate: before this round it was the follower's, past records a reader
given up on never took); its verdict, and
how long after the exit (the exit-status file's time) the verdict came; and the daemon's RSS
before the jobs, at its peak (sampled every 0.25 s), once all are judged, and ``--settle``
seconds later (flat after: the last two within 10%).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PY, Daemon, machine_note, percentile, table

# argv: redraws a second, seconds.  Paced in blocks of 100 redraws; the bar's total is all it draws.
REDRAWER = """\
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
total = int(rate * seconds)
start = time.monotonic()
out = sys.stdout
for i in range(1, total + 1):
    out.write(f"\\rLoading checkpoint shards: {100 * i // total}%|###| {i}/{total} [00:00<00:01, 5.0it/s]")
    if i % 100 == 0:
        out.flush()
        ahead = start + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
out.write("\\n")
out.flush()
raise KeyError("layers.0.weight_scale")
"""


def mib(n: float) -> str:
    return f"{n / (1 << 20):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rate", type=float, default=2000.0, help="redraws a second per job")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each job redraws before it crashes")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the last verdict to sample RSS again")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()

    with Daemon() as daemon:
        script = daemon.home / "redrawer.py"
        script.write_text(REDRAWER)
        names = [f"redraw{i:03d}" for i in range(args.jobs)]
        specs = [daemon.spec(name, [PY, str(script), str(args.rate), str(args.seconds)],
                             extra="[restart]\nmax_attempts = 1\n") for name in names]
        proc = daemon.process()
        time.sleep(1.0)
        rss_before = proc.memory_info().rss
        peak = [rss_before]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except OSError:
                    return
                time.sleep(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.time()
        daemon.start_jobs(specs)
        daemon.wait_finished(names, args.timeout)
        judged_all = time.time()
        rss_judged = proc.memory_info().rss
        time.sleep(args.settle)
        rss_settled = proc.memory_info().rss
        sampling.set()
        sampler.join()

        db = daemon.db()
        rows = db.execute("SELECT job, log_offset, log_path, status_path, verdict, reason, exit_code, failure_json "
                          "FROM attempts ORDER BY job").fetchall()
        verdict_ts = dict(db.execute("SELECT job, MAX(ts) FROM events WHERE kind = 'verdict' GROUP BY job").fetchall())
        at_end, read_whole, sizes, unread, lags = 0, 0, [], [], []
        verdicts: collections.Counter[str] = collections.Counter()
        for job, offset, log_path, status_path, verdict, reason, exit_code, failure in rows:
            size = os.path.getsize(log_path)
            sizes.append(size)
            recognised = "layers.0.weight_scale" in (failure or "")
            at_end += offset == size
            read_whole += offset == size and recognised
            if offset != size:
                unread.append(f"{job}: {offset:,} of {size:,} bytes")
            verdicts[f"{verdict}, exit {exit_code}, traceback {'recognised' if recognised else 'NOT recognised'}"
                     + (", says log not read to its end" if "not read to its end" in (reason or "") else "")] += 1
            if job in verdict_ts and os.path.exists(status_path):
                lags.append(verdict_ts[job] - os.path.getmtime(status_path))

    print(machine_note())
    print(f"\n{args.jobs} jobs x {args.rate:.0f} redraws/s x {args.seconds:.0f} s, then a traceback and exit 1; "
          f"logs {mib(min(sizes))}-{mib(max(sizes))} MiB each, {mib(sum(sizes))} MiB in all; "
          f"all judged {judged_all - started:.0f} s after the start\n")
    print(table(["ended attempts", "stored offset at the log's end", "and its traceback recognised: read to the end",
                 "not read to the end"], [[len(rows), at_end, read_whole, len(rows) - read_whole]]))
    for line in unread[:10]:
        print(f"  unread: {line}")
    print()
    print(table(["verdict", "attempts"], sorted(verdicts.items())))
    print()
    if lags:
        print(table(["verdict after exit", "p50 s", "max s"],
                    [["", f"{percentile(lags, 50):.1f}", f"{max(lags):.1f}"]]))
        print()
    flat = abs(rss_settled - rss_judged) <= 0.1 * rss_judged
    print(table(["RSS MiB: before", "peak", "all judged", f"+{args.settle:.0f} s", "flat after"],
                [[mib(rss_before), mib(peak[0]), mib(rss_judged), mib(rss_settled), "yes" if flat else "NO"]]))


if __name__ == "__main__":
    main()
