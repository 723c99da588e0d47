"""Detection latency: a line written by a job -> its event stored, beside what a shell can do.

    .venv/bin/python tests/perf/bench_detection.py [--rate 200] [--seconds 10] [--polls 1,10] [--quick]

One real daemon runs one job: a writer (tests/perf/_writer.py) that puts ``time.time()`` at the
start of every line and writes it with a flush, ``--rate`` lines a second for ``--seconds``.
Every tenth line is a transformers loss line (a metric event, stored every time); the others
are one transformers shard bar (``Loading checkpoint shards:  50%|###| k/N [..]``), which the
daemon stores at its milestones (its first line and each whole percent; progress is state, a
redraw between milestones is no row of its own).  The lines compared are the ones the daemon
surfaces: those it stored as rows of their own.  While it writes, in the same run, the same
log is read by:

- the daemon, seen three ways: the stored event's ``ts`` (set when the event object is
  created, just before the transaction that stores it commits: a lower bound on "stored");
  the stored row becoming visible to another process (a reader woken by inotify on the
  store's WAL file, which then queries the table: "stored and committed");
  the event arriving on the daemon's event stream (``supervise events -f``: "published");
- ``tail -n +1 -F LOG | grep --line-buffered -e 'Loading checkpoint shards' -e "'loss'"`` piped
  into a reader that stamps each arrival: the best a shell can do.  Its latency is taken over
  the same lines as the daemon's (and, on a row of its own, over every line it passed);
- ``while :; do sleep N; tail -n 1 LOG; done`` for each N of ``--polls``: what users do
  today.  A poll shows the newest line; every line written before that line counts as seen
  at that poll (progress is cumulative), so latency = poll time - write time.

Latency = arrival stamp - the writer's stamp, same clock.  With ``--quick`` (5 s of writing)
a 10 s poll loop polls once or twice while the writer writes, so its percentiles depend on
where those polls fall.  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    PY,
    STAMP,
    WRITER,
    Daemon,
    kill_group,
    machine_note,
    ms,
    percentile,
    stamp_of,
    table,
    wait_until,
    write_go,
)

PATTERNS = ("Loading checkpoint shards", "'loss'")
LOSS_EVERY = 10  # every tenth line a loss line: a metric event stored each time


def read_arrivals(path: Path) -> list[tuple[float, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        arrival, _, text = line.partition("\t")
        out.append((float(arrival), text))
    return out


def per_line(arrivals: list[tuple[float, str]]) -> dict[float, float]:
    """Each arrival is one line: stamp -> latency (first arrival of a line wins)."""
    seen: dict[float, float] = {}
    for arrival, text in arrivals:
        stamp = stamp_of(text)
        if stamp is not None and stamp not in seen:
            seen[stamp] = arrival - stamp
    return seen


def per_poll(arrivals: list[tuple[float, str]], written: list[float]) -> dict[float, float]:
    """Each arrival is the newest line at a poll: it reveals every line written up to it."""
    seen: dict[float, float] = {}
    ordered = sorted(written)
    i = 0
    for arrival, text in arrivals:
        newest = stamp_of(text)
        if newest is None:
            continue
        while i < len(ordered) and ordered[i] <= newest:
            seen[ordered[i]] = arrival - ordered[i]
            i += 1
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="lines per second (default 200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the writer writes (default 10)")
    parser.add_argument("--polls", default="1,10", help="sleep intervals of the poll loops, seconds (default 1,10)")
    parser.add_argument("--quick", action="store_true", help="5 s of writing (about 30 s in all)")
    parser.add_argument("--keep", action="store_true", help="keep the daemon's state directory")
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 5.0)
    polls = [float(p) for p in args.polls.split(",") if p]
    lines = int(args.rate * args.seconds)

    print(machine_note())
    helpers: list[subprocess.Popen[bytes]] = []
    with Daemon(keep=args.keep) as daemon:
        home = daemon.home
        go = home / "go"
        spec = daemon.spec("detect", [PY, str(WRITER), "--rate", str(args.rate), "--lines", str(lines),
                                      "--event-every", "1", "--loss-every", str(LOSS_EVERY), "--go", str(go)],
                           extra="[restart]\nmax_attempts = 1\n")
        started = daemon.start_jobs([spec])[0]
        log = started.log_path
        outs = {"events": home / "events.tsv", "commits": home / "commits.tsv", "tailgrep": home / "tailgrep.tsv"}
        outs.update({f"poll{p:g}": home / f"poll{p:g}.tsv" for p in polls})

        def helper(argv: list[str]) -> None:
            helpers.append(subprocess.Popen(argv, env=daemon.env, start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        helper([PY, str(STAMP), "events", str(home), "detect", str(outs["events"])])
        helper([PY, str(STAMP), "commits", str(daemon.paths.db), str(outs["commits"])])
        helper(["sh", "-c", 'tail -n +1 -F "$1" 2>/dev/null | grep --line-buffered -e "$2" -e "$3" | "$4" "$5" stdin "$6"',
                "sh", log, *PATTERNS, PY, str(STAMP), str(outs["tailgrep"])])
        for p in polls:
            helper(["sh", "-c", 'while :; do sleep "$1"; tail -n 1 "$2"; done | "$3" "$4" stdin "$5"',
                    "sh", f"{p:g}", log, PY, str(STAMP), str(outs[f"poll{p:g}"])])
        wait_until(lambda: all(Path(str(o) + ".ready").exists() for o in outs.values()), 20, "the readers")
        time.sleep(0.5)  # tail has opened the log by now
        write_go(go)
        daemon.wait_finished(["detect"], timeout=args.seconds * 3 + 30)
        time.sleep(max(polls, default=0) + 0.5)  # the slowest poll loop shows the last line too
        db = daemon.db()
        stored = db.execute("SELECT ts, message FROM events WHERE job='detect' AND kind IN ('progress', 'metric')"
                            ).fetchall()
        for proc in helpers:
            kill_group(proc)
        log_text = Path(log).read_text(errors="replace")
        written = [s for s in (stamp_of(x) for x in log_text.splitlines() if any(p in x for p in PATTERNS))
                   if s is not None]
        verdict = db.execute("SELECT message FROM events WHERE job='detect' AND kind='verdict'").fetchone()
        db.close()

        # The lines the daemon surfaced: each stored as a row of its own (a bar's milestones, every
        # loss line).  Every reader is measured on these same lines.
        surfaced = {s for _, m in stored if (s := stamp_of(m)) is not None}
        grep_all = per_line(read_arrivals(outs["tailgrep"]))
        results: list[tuple[str, dict[float, float]]] = [
            ("daemon: event `ts` (created just before its commit)", {s: ts - s for ts, m in stored if (s := stamp_of(m)) is not None}),
            ("daemon: stored row visible to another reader", per_line(read_arrivals(outs["commits"]))),
            ("daemon: published on `events -f` stream", per_line(read_arrivals(outs["events"]))),
            ("`tail -F` \\| `grep --line-buffered`", grep_all),
        ]
        results += [(f"`sleep {p:g} && tail -n 1` loop", per_poll(read_arrivals(outs[f"poll{p:g}"]), written)) for p in polls]
        results = [(label, {s: v for s, v in seen.items() if s in surfaced}) for label, seen in results]

    base = percentile(list(results[3][1].values()), 99)
    rows = []
    for label, seen in results:
        values = list(seen.values())
        p99 = percentile(values, 99)
        rows.append([label, f"{len(values)}/{len(surfaced)}", ms(percentile(values, 50)), ms(p99),
                     ms(max(values, default=float("nan"))), f"{p99 / base:.1f}x" if base > 0 else "-"])
    every = list(grep_all.values())
    rows.append(["`tail -F` \\| `grep`, every line it passed (bar redraws too)", f"{len(every)}/{len(written)}",
                 ms(percentile(every, 50)), ms(percentile(every, 99)), ms(max(every, default=float("nan"))), "-"])
    metrics = sum(1 for x in log_text.splitlines() if PATTERNS[1] in x)
    print(f"\nwriter: {lines} lines at {args.rate:g} lines/s for {args.seconds:g} s: {len(written) - metrics} redraws of "
          f"one shard bar, {metrics} loss lines; the daemon surfaced {len(surfaced)} of them as rows of their own "
          f"(the bar's milestones, every loss line); job verdict: {verdict[0] if verdict else '?'}\n")
    print(table(["reader (over the lines the daemon surfaced)", "lines seen", "p50 ms", "p99 ms", "max ms",
                 "p99 vs `tail -F \\| grep`"], rows))
    for index in (0, 1, 2):
        p99 = percentile(list(results[index][1].values()), 99)
        ratio = p99 / base if base > 0 else float("inf")
        print(f"\ntarget (daemon p99 within 2x of `tail -F | grep` on the same lines), {results[index][0]}: "
              f"{ratio:.1f}x -> {'met' if ratio <= 2 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
