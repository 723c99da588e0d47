"""What a followed line costs the loop past matching: each line made an event and judged, or
redraws and unchanged access-log lines taken from their counts (jobs/redraw_runs.py).

    .venv/bin/python tests/perf/bench_redraw_runs.py [--lines 6000] [--per-read 1,2,7] [--repeat 5]

Two logs of the busy benchmark (bench_scale.py's ``redraws`` and ``access-log``, written as
tests/perf/_writer.py writes them) are matched once with the benchmarks' packs; their probe events
are then fed in reads of ``--per-read`` lines to a watchdog, the stored milestones and the event
cap (1,000 for the access log, as bench_scale runs it), two ways in one run:

- *one by one*: each line made an ``Event``, fed to ``Watchdog.observe``, sieved and counted
  (``ProgressMilestones.keep``, ``EventCap.admits``): what every line cost before;
- *taken*: as ``AttemptWatch._observe`` now feeds them: ``RedrawRuns.take`` first, an info line the
  watchdog says it would not change (``Watchdog.unchanged_by``) not fed, the rest as before.

Prints the process's CPU µs per line for each (the median of ``--repeat`` runs), their ratio, how
many events each made, and whether both ways left the watchdog and the stored rows the same.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PACKS, machine_note, table

from supervisor.core.events import Event, EventKind, ProbeEvent, ProbeKind, Record
from supervisor.core.payloads import ProbeFields, jsonable
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.milestones import ProgressMilestones
from supervisor.jobs.redraw_runs import RedrawRuns
from supervisor.probes import ProbeEngine, load_packs
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog import Watchdog


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _log(kind: str, lines: int) -> list[str]:
    """The lines of _writer.py's log (without the stamp, which no probe reads)."""
    every = 1 if kind == "redraws" else 10
    bars = lines // every
    out, done = [], 0
    for i in range(lines):
        if (i + 1) % every == 0:
            done += 1
            pct = 100 * done // bars
            out.append(f"Loading checkpoint shards: {pct:3d}%|{'#' * (pct // 10):<10}| {done}/{bars} "
                       "[00:05<00:05,  1.00s/it]")
        else:
            out.append(f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK')
    return out


def _events(kind: str, lines: int) -> list[ProbeEvent]:
    packs = [*PACKS, "uvicorn"] if kind == "access-log" else PACKS
    engine = ProbeEngine(load_packs(packs))
    records, offset = [], 0
    for text in _log(kind, lines):
        records.append(Record(text, offset, offset + len(text) + 1))
        offset += len(text) + 1
    return engine.feed_many(records) + engine.flush()


def _event(pe: ProbeEvent) -> Event:
    return Event(job="j", attempt=1, kind=EventKind(pe.kind.value), message=pe.line, probe=pe.probe, phase=pe.phase,
                 offset=pe.offset, data=ProbeFields(jsonable(pe.fields)).to_json(), failure=pe.failure)


def _feed(events: list[ProbeEvent], per_read: int, cap_limit: int, taken: bool) -> tuple[float, int, Any]:
    """CPU seconds, events made, and what was judged and stored, for one way of feeding."""
    watchdog = Watchdog(HealthSpec(), clock=lambda: 0.0, started_at=0.0)
    sieve, cap = ProgressMilestones(), EventCap(limit=cap_limit)
    stored: list[int | None] = []
    made = 0

    def keep(event: Event) -> None:
        sieve.latest_only = cap.reached
        if cap.admits(event, kept=sieve.keep(event, event.ts)):
            stored.append(event.offset)

    def judged(pe: ProbeEvent, at: float) -> Event:
        nonlocal made
        made += 1
        event = _event(pe)
        watchdog.observe(event, at)
        return event

    started = _cpu()
    for start in range(0, len(events), per_read):
        read = events[start:start + per_read]
        at = start * 0.001
        watchdog.output_seen(at)
        if not taken:
            for pe in read:
                keep(judged(pe, at))
            continue
        runs = RedrawRuns(watchdog, sieve, cap, job="j", attempt=1, generation=0, ts=at, at=at,
                          feed=lambda lines, at=at: [judged(pe, at) for pe in lines] and None)
        for pe in read:
            if runs.take(pe):
                continue
            if pe.kind is ProbeKind.INFO and pe.failure is None and watchdog.unchanged_by(pe.probe, pe.phase,
                                                                                         pe.fields, at):
                if cap.reached:
                    cap.drop()
                    continue
                made += 1
                keep(_event(pe))
                continue
            keep(judged(pe, at))
        runs.close()
    cpu = _cpu() - started
    latest, _ = sieve.to_save()
    look = (watchdog.state(at), watchdog.paces(), stored, [e.offset for e in latest], cap.stored, cap.dropped)
    return cpu, made, look


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=6000, help="lines of each log (default 6000)")
    parser.add_argument("--per-read", default="1,2,7", help="lines a read (default 1,2,7: §26, §39)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each way; the median is shown (default 5)")
    args = parser.parse_args()
    print(machine_note())
    rows = []
    for kind, cap_limit in (("redraws", 10_000), ("access-log", 1000)):
        events = _events(kind, args.lines)
        for per_read in (int(n) for n in args.per_read.split(",") if n):
            figures: dict[bool, list[float]] = {False: [], True: []}
            made: dict[bool, int] = {}
            looks: dict[bool, Any] = {}
            for _ in range(args.repeat):
                for taken in (False, True):  # alternating: the same load for both
                    cpu, made[taken], looks[taken] = _feed(events, per_read, cap_limit, taken)
                    figures[taken].append(cpu)
            before, after = (statistics.median(figures[t]) / args.lines * 1e6 for t in (False, True))
            rows.append([kind, str(per_read), f"{len(events)}", f"{before:.1f}", f"{after:.1f}", f"{before / after:.1f}x",
                         f"{made[False]} / {made[True]}", "yes" if looks[False] == looks[True] else "NO"])
    print()
    print(table(["log", "lines a read", "probe events", "one by one, CPU us a line", "taken, CPU us a line",
                 "one by one / taken", "events made (one by one / taken)", "same judged and stored"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
