"""Daemon cost and detection latency while it follows N busy logs at once.

    .venv/bin/python tests/perf/bench_scale.py [--jobs 1,10,100] [--total-rate 1500] [--seconds 10]
                                               [--event-every 10] [--busy 8x1000] [--busy-logs workers,redraws,access-log]
                                               [--profile DIR] [--quick] [--tree DIR] [--responsiveness]
    .venv/bin/python tests/perf/bench_scale.py --summarize DIR/PROFILE.raw.txt

For each configuration, a fresh real daemon runs N jobs, each tests/perf/_writer.py: stamped
lines (``time.time()`` first, one write and flush per line) at a steady rate, every
``--event-every``-th line a transformers shard bar (a progress event), the others worker
lines that no probe matches.  The writers wait until all N are up, start together (each
offset by a fraction of its line period, so that they do not write in lock-step), write for
``--seconds`` and then stay alive (so attempt endings stay out of the window).

- ``--jobs`` share ``--total-rate`` lines/s between them (N = 1, 10, 100 by default);
- ``--busy JOBSxRATE`` adds the configuration of the cost target: 8 jobs x 1000 lines/s, once
  for each log of ``--busy-logs``:

  - ``workers``: a shard bar every ``--event-every``-th line, plain worker lines between;
  - ``redraws`` (redraw-heavy): every line a redraw of the bar, each a step; the daemon stores
    its milestones (each whole percent), the rest only move the bar;
  - ``access-log`` (a vLLM server answering RATE requests/s): a shard bar every
    ``--event-every``-th line, between them one uvicorn access-log line per request (the
    ``uvicorn`` pack reads each as a request answered); the daemon runs with
    ``events_per_attempt`` = 1000, so most of them come past the cap (counted, not stored).

Per configuration: detection latency (stored event ``ts`` - the line's stamp; ``ts`` is set
when the event object is created, just before its transaction commits), p50/p99/max; the
daemon's CPU seconds (psutil ``cpu_times`` user+system of the daemon pid, from the writers'
start until every expected event is stored; the kernel's share shown apart) per million lines
and as % of one core over that window, with how often it slept and was woken (voluntary
context switches) and its read system calls, per thousand lines; its CPU while the N jobs
are up but quiet (idle); its RSS (peak of samples every 0.25 s, and before the writers start).  Targets: p99 under 50 ms at N = 100; under 2 % of a core at
8 jobs x 1000 lines/s.

``--tree DIR`` runs each ``--busy`` configuration twice, alternating, once with the daemon of
another checkout (``git archive`` of the tree before a change: its bytecode compiled first), so
that before and after are measured in one run under the same load; each row says which tree.

``--responsiveness`` also times, during each window, a ``status`` round trip every 0.25 s and the
job page's feed (``/api/stream``) from its request to its first data (the history's first event) and
to its first status payload every 1 s, each on its own thread and schedule (targets: status p99 <=
100 ms, the page's first data <= 200 ms).

``--profile DIR`` samples the daemon with py-spy (``py-spy record --gil --format raw``, which
pauses it 200 times a second: use the figures of a run without it) during each window and
prints where its Python time goes (self and inclusive, by function).  Prints markdown tables.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    PACKS,
    PY,
    WRITER,
    Daemon,
    machine_note,
    ms,
    open_page,
    page_first_data,
    percentile,
    stamp_of,
    table,
    wait_until,
    write_go,
)

ROOT = Path(__file__).resolve().parents[2]
ACCESS_LOG_CAP = 1000  # events_per_attempt of the access-log profile: most requests come past it


@dataclass
class Config:
    label: str
    jobs: int
    rate: float  # lines/s per job
    seconds: float
    every: int
    plain: str = "workers"  # the lines between the bars: "workers" (no probe reads them) or "access-log"
    tree: Path | None = None  # the checkout whose daemon runs (None: this one)

    @property
    def lines_per_job(self) -> int:
        lines = max(self.every, int(self.rate * self.seconds))
        return lines - lines % self.every  # the last line is a bar: "all stored" is then exact


@dataclass
class Outcome:
    config: Config
    latencies: list[float]
    events: int
    expected: int
    cpu_s: float
    sys_s: float  # of cpu_s, in the kernel
    wakes: int  # voluntary context switches: times the daemon went to sleep and was woken
    reads: int  # read-type system calls
    window_s: float
    idle_pct: float
    rss_before: int
    rss_peak: int
    write_span_s: float  # the writers' start to the last line's stamp
    profile: Path | None = None
    notes: list[str] = field(default_factory=list)
    status_s: list[float] = field(default_factory=list)  # --responsiveness: `status` round trips in the window
    page_data_s: list[float] = field(default_factory=list)  # and the page feed's first data
    page_s: list[float] = field(default_factory=list)  # and its first status payload

    @property
    def lines(self) -> int:
        return self.config.jobs * self.config.lines_per_job


class Responsiveness(threading.Thread):
    """While the writers write: a ``status`` round trip every 0.25 s (a fresh connection each, as
    the CLI makes) and, on a thread of its own every 1 s, the job page's feed opened until its first
    status payload.  Each is due on a fixed schedule (a call that overruns its turn starts the next at
    once), so a slow page open does not thin out the ``status`` calls, as one loop for both did."""

    def __init__(self, daemon: Daemon, job: str, page: tuple[str, str]) -> None:
        super().__init__(daemon=True)
        self.d, self.job, self.page = daemon, job, page
        self.stop = threading.Event()
        self.status_s: list[float] = []
        self.page_data_s: list[float] = []
        self.page_s: list[float] = []

    def _every(self, period_s: float, call: Callable[[], None]) -> None:
        due = time.monotonic() + period_s
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + period_s, time.monotonic())
            call()

    def _status(self) -> None:
        client = self.d.client()
        t = time.perf_counter()
        client.status()
        self.status_s.append(time.perf_counter() - t)
        client.close()

    def _page(self) -> None:
        data, status = page_first_data(*self.page, self.job)
        if not math.isnan(data):
            self.page_data_s.append(data)
        if not math.isnan(status):
            self.page_s.append(status)

    def run(self) -> None:
        pages = threading.Thread(target=self._every, args=(1.0, self._page), daemon=True)
        pages.start()
        self._every(0.25, self._status)
        pages.join()


def run(config: Config, profile_dir: Path | None, keep: bool, responsiveness: bool = False) -> Outcome:
    access_log = config.plain == "access-log"
    env = {"SUPERVISE_EVENTS_PER_ATTEMPT": str(ACCESS_LOG_CAP)} if access_log else None
    with Daemon(keep=keep, env=env, tree=config.tree) as daemon:
        home = daemon.home
        go, ready = home / "go", home / "ready"
        ready.mkdir()
        specs = [daemon.spec(f"w{i:03d}", [PY, str(WRITER), "--rate", f"{config.rate:g}",
                                           "--lines", str(config.lines_per_job), "--event-every", str(config.every),
                                           "--phase", f"{i / config.jobs:.4f}", "--go", str(go), "--ready", str(ready), "--linger",
                                           *(["--access-log"] if access_log else [])],
                             probes=[*PACKS, "uvicorn"] if access_log else PACKS, extra="[restart]\nmax_attempts = 1\n")
                 for i in range(config.jobs)]
        page = open_page(daemon, 18700 + os.getpid() % 1000) if responsiveness else None
        daemon.start_jobs(specs)
        wait_until(lambda: len(list(ready.iterdir())) >= config.jobs, 120, f"{config.jobs} writers to be ready", 0.1)
        proc = daemon.process()
        rss_before = proc.memory_info().rss
        time.sleep(0.5)  # let launch-time work settle
        cpu0 = sum(proc.cpu_times()[:2])
        time.sleep(2.0)
        idle_pct = (sum(proc.cpu_times()[:2]) - cpu0) / 2.0 * 100

        peak = [rss_before]
        stop = threading.Event()

        def sample_rss() -> None:
            while not stop.wait(0.25):
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except Exception:  # noqa: BLE001 - the daemon may be gone at the very end
                    return

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        expected = config.jobs * (config.lines_per_job // config.every)
        db = daemon.db()
        spy = None
        profile = None
        if profile_dir is not None:
            profile = profile_dir / f"{re.sub(r'[^A-Za-z0-9=]+', '_', config.label)}.raw.txt"
            spy = subprocess.Popen([shutil.which("py-spy") or str(Path(PY).parent / "py-spy"), "record", "-p", str(daemon.pid),
                                    "-f", "raw", "-o", str(profile), "-r", "200", "--gil",
                                    "-d", str(int(config.seconds + 5))],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached
        start_at = write_go(go, delay_s=0.5)
        time.sleep(max(0.0, start_at - time.time()))
        cpu_start = proc.cpu_times()
        # not `sampler`: that name is the RSS sampler's thread, joined below
        responder = Responsiveness(daemon, "w000", page) if page is not None else None
        if responder is not None:
            responder.start()
        wakes_start = proc.num_ctx_switches().voluntary
        reads_start = proc.io_counters().read_count

        # A bar's redraws between its milestones are not rows of their own (progress is state: each
        # bar's latest line is one row, replaced in place); every job's last line stored is the end.
        bars = config.lines_per_job // config.every
        last_line = f"| {bars}/{bars} ["

        def stored() -> bool:
            return db.execute("SELECT COUNT(*) FROM events WHERE kind='progress' AND instr(message, ?) > 0",
                              (last_line,)).fetchone()[0] >= config.jobs

        wait_until(stored, config.seconds * 4 + 60, f"every job's last bar line ({expected} in all) to be read",
                   interval=0.05)
        cpu_end = proc.cpu_times()
        if responder is not None:
            responder.stop.set()
            responder.join()
        wakes = proc.num_ctx_switches().voluntary - wakes_start
        reads = proc.io_counters().read_count - reads_start
        cpu_s = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
        sys_s = cpu_end.system - cpu_start.system
        window = time.time() - start_at
        stop.set()
        sampler.join()
        rows = db.execute("SELECT ts, message FROM events WHERE kind='progress'").fetchall()
        db.close()
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes what it has
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
        stamps = [s for _, m in rows if (s := stamp_of(m)) is not None]
        latencies = [ts - s for ts, m in rows if (s := stamp_of(m)) is not None]
    return Outcome(config, latencies, len(rows), expected, cpu_s, sys_s, wakes, reads, window, idle_pct, rss_before, peak[0],
                   (max(stamps) - start_at) if stamps else 0.0, profile,
                   status_s=responder.status_s if responder is not None else [],
                   page_data_s=responder.page_data_s if responder is not None else [],
                   page_s=responder.page_s if responder is not None else [])


def summarize_profile(path: Path, top: int = 14) -> str:
    """Self and inclusive sample counts by function from py-spy's raw (collapsed) output."""
    self_count: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if f]
        if frames:
            self_count[frames[-1]] += count
        for name in set(frames):
            incl[name] += count
    if not total:
        return f"(no samples in {path})"
    rows_self = [[f"`{name}`", f"{100 * c / total:.1f}%"] for name, c in self_count.most_common(top)]
    # Frames on (nearly) every stack are the event loop's own chain: leave them out.
    below_root = [(name, c) for name, c in incl.most_common() if c < 0.97 * total]
    rows_incl = [[f"`{name}`", f"{100 * c / total:.1f}%"] for name, c in below_root[: top + 6]]
    return (f"{total} samples of the thread holding the GIL (py-spy --gil; kernel time is not in them)\n\nself (where the CPU is spent):\n\n" + table(["function", "samples"], rows_self)
            + "\n\ninclusive (the function or anything it calls):\n\n" + table(["function", "samples"], rows_incl))


def _frame(frame: str) -> str:
    # "name (path/to/file.py:123)" -> "file.py:name"; the thread/process header frames are dropped.
    name, _, where = frame.partition(" (")
    if not where:
        return ""
    file = where.rstrip(")").rsplit(":", 1)[0]
    short = file.split("/site-packages/")[-1] if "/site-packages/" in file else file.replace(str(ROOT) + "/", "")
    if "/lib/python3" in short:
        short = "stdlib:" + short.rsplit("/", 1)[-1]
    return f"{short}:{name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="1,10,100", help="numbers of concurrent jobs (default 1,10,100)")
    parser.add_argument("--total-rate", type=float, default=1500.0, help="lines/s across all jobs (default 1500)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each writer writes (default 10)")
    parser.add_argument("--event-every", type=int, default=10, help="every K-th line is a progress bar (default 10)")
    parser.add_argument("--busy", default="8x1000", help="JOBSxRATE of the cost target, '' for none (default 8x1000)")
    parser.add_argument("--busy-logs", default="workers,redraws,access-log",
                        help="the logs of the --busy configuration, each run apart (default workers,redraws,access-log)")
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles of the daemon (needs py-spy)")
    parser.add_argument("--summarize", type=Path, help="only print the summary of a py-spy raw profile written before")
    parser.add_argument("--quick", action="store_true", help="4 s of writing per configuration")
    parser.add_argument("--keep", action="store_true", help="keep the daemons' state directories")
    parser.add_argument("--tree", type=Path, metavar="DIR",
                        help="also run each --busy configuration with the daemon of this checkout (before/after)")
    parser.add_argument("--responsiveness", action="store_true",
                        help="while the writers write, time `status` (every 0.25 s) and the page feed's first "
                             "status payload (every 1 s); printed as percentiles beside their targets")
    args = parser.parse_args()
    if args.summarize:
        print(summarize_profile(args.summarize))
        return 0
    if args.quick:
        args.seconds = min(args.seconds, 4.0)
    configs = [Config(f"N={n}", n, args.total_rate / n, args.seconds, args.event_every)
               for n in (int(x) for x in args.jobs.split(",") if x)]
    if args.busy:
        jobs, rate = args.busy.lower().split("x")
        for kind in (k for k in args.busy_logs.split(",") if k):
            if kind not in ("workers", "redraws", "access-log"):
                parser.error(f"--busy-logs: unknown log {kind!r} (workers, redraws, access-log)")
            for tree in ([args.tree.resolve(), None] if args.tree else [None]):
                where = "" if args.tree is None else f" [{'before: ' + tree.name if tree else 'this tree'}]"
                configs.append(Config(f"{jobs} x {rate}/s, {kind}{where}", int(jobs), float(rate), args.seconds,
                                      1 if kind == "redraws" else args.event_every,
                                      "access-log" if kind == "access-log" else "workers", tree))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    print(machine_note())
    outcomes = [run(c, args.profile, args.keep, args.responsiveness) for c in configs]
    print(f"\nwriters: {args.seconds:g} s each; every {args.event_every}th line a progress bar; "
          f"latency = stored event ts - the line's stamp\n")
    rows = []
    for o in outcomes:
        c = o.config
        rows.append([c.label, f"{c.rate:g}", f"{o.lines / o.write_span_s:.0f}" if o.write_span_s else "-",
                     f"{o.events}/{o.expected}", ms(percentile(o.latencies, 50)), ms(percentile(o.latencies, 99)),
                     ms(max(o.latencies, default=float("nan"))),
                     f"{o.cpu_s:.2f}", f"{100 * o.sys_s / o.cpu_s:.0f}%" if o.cpu_s else "-", f"{o.cpu_s / o.lines * 1e6:.1f}",
                     f"{1000 * o.wakes / o.lines:.0f}", f"{1000 * o.reads / o.lines:.0f}", f"{100 * o.cpu_s / o.window_s:.1f}%",
                     f"{o.idle_pct:.2f}%", f"{o.rss_before / 2**20:.0f}", f"{o.rss_peak / 2**20:.0f}"])
    print(table(["jobs", "lines/s per job", "lines/s achieved", "events stored", "p50 ms", "p99 ms", "max ms",
                 "daemon CPU s", "of it kernel", "CPU s per 1M lines",
                 "wake-ups per 1k lines", "read calls per 1k lines", "% of a core", "idle % core", "RSS before MiB", "RSS peak MiB"],
                rows))
    print()
    for o in outcomes:
        if o.config.jobs == 100:
            p99 = percentile(o.latencies, 99)
            print(f"target p99 < 50 ms at N = 100: {p99 * 1000:.1f} ms -> {'met' if p99 < 0.05 else 'MISSED'}")
        if args.busy and " x " in o.config.label:
            pct = 100 * o.cpu_s / o.window_s
            per_line = o.cpu_s / o.lines * 1e6
            print(f"target <= 10 us of daemon CPU per line at {o.config.label}: {per_line:.1f} us -> "
                  f"{'met' if per_line <= 10 else 'MISSED'} ({o.cpu_s:.2f} CPU s over {o.window_s:.1f} s, "
                  f"{pct:.1f}% of a core; the older target, < 2% of a core, {'met' if pct < 2 else 'missed'})")
    if args.responsiveness:
        print("\nresponsiveness while the writers write (ms; targets: status p99 <= 100, page first data <= 200):\n")
        print(table(["jobs", "status calls", "status p50", "p90", "p99", "max", "page opens", "page first data p50",
                     "p99", "max", "page first status p50", "p99"],
                    [[o.config.label, len(o.status_s), *(ms(percentile(o.status_s, q)) for q in (50, 90, 99)),
                      ms(max(o.status_s, default=float("nan"))), len(o.page_data_s),
                      *(ms(percentile(o.page_data_s, q)) for q in (50, 99)),
                      ms(max(o.page_data_s, default=float("nan"))),
                      *(ms(percentile(o.page_s, q)) for q in (50, 99))]
                     for o in outcomes]))
        for o in outcomes:
            p99s = percentile(o.status_s, 99) if o.status_s else math.nan
            p99p = percentile(o.page_data_s, 99) if o.page_data_s else math.nan
            print(f"target status p99 <= 100 ms at {o.config.label}: {ms(p99s)} -> "
                  f"{'met' if p99s <= 0.1 else 'MISSED'}; page first data p99 <= 200 ms: {ms(p99p)} -> "
                  f"{'met' if p99p <= 0.2 else 'MISSED'}")
    for o in outcomes:
        if o.profile is not None and o.profile.exists():
            print(f"\n### py-spy profile of the daemon, {o.config.label} ({o.profile})\n")
            print(summarize_profile(o.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
