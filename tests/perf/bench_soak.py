"""A compressed 18-hour soak: long bars at full speed through a real daemon killed three times.

    .venv/bin/python tests/perf/bench_soak.py [--jobs 8] [--redraws 650000] [--scale 1.0] [--kills 3]

``--jobs`` jobs each run tests/perf/_soak_job.py: a real child process writing to its log one
tqdm bar of ``--redraws`` x ``--scale`` redraws (an 18-hour extraction redrawn ~10 times a
second is ~650k) at full speed, a worker line every 4 redraws and a transformers loss line
every 2000 (its loss its sequence number).  While they run, the daemon is SIGKILLed and
started again ``--kills`` times (at 1/4, 2/4, 3/4 of the lines written); a sampler measures,
every 0.5 s, the daemon's RSS and one ``status`` round trip, and every 2 s the job page's first
data: the web page's feed (``/api/stream?job=J&after=0``, what a browser opening the job's
page reads) from the request to its first event.  At the end:

- the store's size (database + WAL) and its rows;
- events lost or doubled across the kills: each job's bar must be stored once per whole percent
  (0..100) and each loss line exactly once;
- ``report`` of one attempt (the CLI, a real process), its wall time.

Targets (issue 33): store <= 50 MB, RSS <= 300 MB and flat after warm-up, status p99 <= 100 ms,
page first data <= 500 ms, 0 lost, report <= 1 s.  Prints markdown.
"""

from __future__ import annotations

import argparse
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _harness import PY, Daemon, machine_note, ms, percentile, table, wait_until

from supervisor.core.protocol import WebRequest

JOB = Path(__file__).resolve().parent / "_soak_job.py"


class Sampler(threading.Thread):
    """RSS, status latency and page first data, sampled while the daemon runs (gaps while it is down)."""

    def __init__(self, daemon: Daemon, job: str) -> None:
        super().__init__(daemon=True)
        self.d, self.job = daemon, job
        self.rss: list[tuple[float, float]] = []  # (elapsed s, MB)
        self.status_s: list[float] = []
        self.page_s: list[float] = []
        self.down = threading.Event()
        self.stop = threading.Event()
        self.web: tuple[str, str] | None = None
        self.t0 = time.time()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            if not self.down.is_set():
                try:
                    self._sample(n)
                except Exception:  # noqa: BLE001 - the daemon was killed mid-sample
                    pass
            n += 1
            self.stop.wait(0.5)

    def _sample(self, n: int) -> None:
        self.rss.append((time.time() - self.t0, self.d.process().memory_info().rss / 2**20))
        client = self.d.client()
        t = time.perf_counter()
        client.status()
        self.status_s.append(time.perf_counter() - t)
        client.close()
        if n % 4 == 0 and self.web is not None:
            base, token = self.web
            t = time.perf_counter()
            with httpx.stream("GET", f"{base}/api/stream?job={self.job}&after=0",
                              headers={"Authorization": f"Bearer {token}"}, timeout=30) as feed:
                for line in feed.iter_lines():
                    if line.startswith("data: "):
                        self.page_s.append(time.perf_counter() - t)
                        break


def _web(d: Daemon, port: int) -> tuple[str, str]:
    url = d.client().web(WebRequest(port=port)).url
    parsed = urlparse(url)
    token = (parse_qs(parsed.query).get("token") or parse_qs(parsed.fragment).get("token") or [""])[0]
    return f"{parsed.scheme}://{parsed.netloc}", token


def _read(d: Daemon, names: list[str], expected: int) -> float:
    """The share of the expected log bytes the daemon has read (and stored the offset of)."""
    rows = d.db().execute("SELECT COALESCE(SUM(log_offset), 0) FROM attempts").fetchone()
    return rows[0] / max(1, expected) if names else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--redraws", type=int, default=650_000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.0, help="redraws per second per job (0: full speed)")
    parser.add_argument("--port", type=int, default=18787)
    parser.add_argument("--keep", action="store_true", help="keep the state directory (printed) to look into")
    args = parser.parse_args()
    redraws = max(1000, int(args.redraws * args.scale))
    metrics = redraws // 2000
    names = [f"soak{i}" for i in range(args.jobs)]
    expected_bytes = args.jobs * redraws * (75 + 60 / 4)  # about: a redraw, a worker line per 4
    print(machine_note())
    print(f"\n{args.jobs} jobs x {redraws:,} redraws (scale {args.scale:g} of {args.redraws:,}), "
          f"a worker line per 4, {metrics} loss lines each; {args.kills} daemon SIGKILLs\n")
    with Daemon(keep=args.keep) as d:
        print(f"state directory: {d.home}")
        web = _web(d, args.port)
        specs = [d.spec(n, [PY, str(JOB), str(redraws), "--rate", str(args.rate)], probes=["python", "tqdm", "transformers"],
                        extra='[health]\ndiverge_k = "off"\n') for n in names]
        sampler = Sampler(d, names[0])
        sampler.web = web
        t0 = time.time()
        sampler.t0 = t0
        sampler.start()
        d.start_jobs(specs)
        kills: list[float] = []
        for k in range(args.kills):
            mark = (k + 1) / (args.kills + 1)
            wait_until(lambda m=mark: _read(d, names, int(expected_bytes)) >= m, 3600, f"{mark:.0%} read", 0.2)
            sampler.down.set()
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            kills.append(time.time() - t0)
            time.sleep(1.0)
            d.start()
            sampler.web = _web(d, args.port)
            sampler.down.clear()
        d.wait_finished(names, 3600)
        wall = time.time() - t0
        sampler.stop.set()
        sampler.join()
        client = d.client()
        lost = doubled = 0
        unread = []
        for name in names:
            events = client.events(name, kinds=["progress", "metric"]).events
            dones = [int(e.data["done"]) for e in events if e.kind == "progress"]
            percents = {100 * d // redraws for d in dones}
            losses = [int(float(e.data["loss"])) for e in events if e.kind == "metric"]
            # Lost: a whole percent or a loss line missing below the last one stored (a gap);
            # doubled: a step or a loss line stored twice.  What was never read is apart (unread).
            lost += len(set(range(max(percents) + 1)) - percents) + len(set(range(1, max(losses, default=0) + 1)) - set(losses))
            doubled += (len(dones) - len(set(dones))) + (len(losses) - len(set(losses)))
            offset, log = d.db().execute("SELECT log_offset, log_path FROM attempts WHERE job = ? ORDER BY n DESC",
                                         (name,)).fetchone()
            read = (offset or 0) / Path(log).stat().st_size
            unread.append(1 - read)
            print(f"{name}: {len(percents)}/101 percents, {len(set(losses))}/{metrics} loss lines, log read to {read:.0%}")
        db = d.paths.db
        size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
        rows = d.db().execute("SELECT COUNT(*) FROM events").fetchone()[0]
        t = time.perf_counter()
        subprocess.run([PY, "-m", "supervisor.cli", "report", names[0]], env=d.env, capture_output=True,
                       check=True, cwd=str(d.home))  # its chart is written where it runs
        report_s = time.perf_counter() - t
        t = time.perf_counter()  # the same CLI's start-up and one round trip, beside it
        subprocess.run([PY, "-m", "supervisor.cli", "status", names[0]], env=d.env, capture_output=True,
                       check=True, cwd=str(d.home))
        cli_s = time.perf_counter() - t
        inside = _report_inside(d, names[0])
        rss = sampler.rss
        warm = [mb for at, mb in rss if at > wall / 4]
        print(table(["figure", "measured", "target"], [
            ("run wall time", f"{wall:.0f} s (kills at {', '.join(f'{k:.0f}' for k in kills)} s)", ""),
            ("store at the end", f"{size / 2**20:.1f} MB, {rows:,} event rows", "<= 50 MB"),
            ("daemon RSS", f"max {max(mb for _, mb in rss):.0f} MB; after warm-up {min(warm):.0f}-{max(warm):.0f} MB",
             "<= 300 MB, flat"),
            ("status", (f"p50 {ms(percentile(sampler.status_s, 50))}, p99 {ms(percentile(sampler.status_s, 99))} "
                        f"({len(sampler.status_s)} calls)"), "p99 <= 100 ms"),
            ("page first data", (f"p50 {ms(percentile(sampler.page_s, 50))}, max {ms(max(sampler.page_s, default=math.nan))} "
                                 f"({len(sampler.page_s)} opens)"), "<= 500 ms"),
            ("events lost / doubled across the kills", f"{lost} / {doubled}", "0 / 0"),
            ("log left unread when judged", f"max {max(unread):.0%} of a job's log", "0"),
            ("report of one attempt", f"{report_s * 1000:.0f} ms (CLI process; `status` by the same CLI: {cli_s * 1000:.0f} ms)", "<= 1 s"),
            ("report's own work, in one process", inside, ""),
        ]))
        print("\nRSS over time (s: MB): " + ", ".join(f"{at:.0f}: {mb:.0f}" for at, mb in rss[:: max(1, len(rss) // 16)]))
    return 0


def _report_inside(d: Daemon, job: str) -> str:
    """``report``'s parts apart from the CLI's start: its imports (matplotlib), the history it
    fetches from the daemon, the chart drawn."""
    t = time.perf_counter()
    from supervisor.cli import report

    imported = time.perf_counter() - t
    client = d.client()
    t = time.perf_counter()
    history = report.fetch_history(client, job)
    fetched = time.perf_counter() - t
    t = time.perf_counter()
    report.render_png(history)
    drawn = time.perf_counter() - t
    client.close()
    return (f"imports {imported * 1000:.0f} ms, history fetched {fetched * 1000:.0f} ms "
            f"({len(history.events)} events), chart {drawn * 1000:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
