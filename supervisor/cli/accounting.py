"""`supervise accounting`: one row per attempt, as Slurm's `sacct` gives — job, shard, host, start,
end, duration, verdict, CPU seconds, peak memory, GPU-hours, exit — as text, JSON lines or CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime

from supervisor.cli._args import client as _client
from supervisor.cli.client import Client
from supervisor.core import formatting as _fmt
from supervisor.core import protocol


@dataclass(frozen=True)
class Row:
    job: str
    attempt: int
    shard: int | None
    host: str
    start: float
    end: float | None
    duration_s: float
    state: str  # the verdict where there is one, else the attempt's state
    cpu_s: float | None
    peak_memory_mib: int | None
    gpu_hours: float | None
    exit_code: int | None
    exit_signal: int | None


def cmd_accounting(args: argparse.Namespace) -> int:
    rows = accounting(_client(), args.since, time.time())
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
    elif args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(list(Row.__dataclass_fields__))
        for row in rows:
            values = {**asdict(row), "start": _iso(row.start), "end": _iso(row.end)}
            writer.writerow(["" if v is None else v for v in values.values()])
    else:
        _print_table(rows)
    return 0


def _iso(ts: float | None) -> str | None:
    """A time in a CSV cell: ISO-8601, local with its UTC offset, to the second, as a spreadsheet and
    `date -d` read it (epoch seconds read as a number; `duration_s` stays one)."""
    return None if ts is None else datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def accounting(client: Client, since: float | None, now: float) -> list[Row]:
    """Every attempt of every job that ran at or after ``since`` (all when None), oldest first."""
    rows = []
    for job in client.status().jobs:
        for a in client.attempts(job.name).attempts:
            if since is not None and (a.ended if a.ended is not None else now) < since:
                continue
            rows.append(_row(a, now))
    return sorted(rows, key=lambda r: (r.start, r.job, r.attempt))


def _row(a: protocol.AttemptInfo, now: float) -> Row:
    used = a.usage
    return Row(job=a.job, attempt=a.n, shard=a.shard, host=a.host, start=a.started, end=a.ended,
               duration_s=round((a.ended if a.ended is not None else now) - a.started, 3),
               state=(a.verdict or a.state).value, cpu_s=None if used is None else used.cpu_s,
               peak_memory_mib=None if used is None else used.peak_memory_mib,
               gpu_hours=None if used is None or used.gpu_hours is None else round(used.gpu_hours, 4),
               exit_code=a.exit_code, exit_signal=a.exit_signal)


def _print_table(rows: list[Row]) -> None:
    if not rows:
        print("no attempts")
        return
    # Job and host columns as wide as their longest entry (a host is shown without its scheme and
    # login, as sacct's NodeList: `ssh://me@gpu-box:22` is `gpu-box:22`), so nothing is cut.
    hosts = [_host_label(r.host) for r in rows]
    jw = max(3, *(len(r.job) for r in rows))
    hw = max(4, *(len(h) for h in hosts))
    print(f"{'job':<{jw}} {'#':>4} {'shard':>5} {'host':<{hw}} {'start':<19} {'end':<19} {'duration':>9} {'state':<9} "
          f"{'cpu':>9} {'peak mem':>10} {'GPU-h':>7} exit")
    for r, host in zip(rows, hosts, strict=True):
        end = _fmt.timestamp(r.end) if r.end is not None else "running"
        exit_ = "-" if r.exit_code is None else (f"sig {r.exit_signal}" if r.exit_signal else str(r.exit_code))
        mem = _fmt.size(r.peak_memory_mib * 1024 * 1024) if r.peak_memory_mib is not None else "-"
        cpu = _fmt.cpu_time(r.cpu_s) if r.cpu_s is not None else "-"
        gpu = f"{r.gpu_hours:.2f}" if r.gpu_hours is not None else "-"
        shard = _fmt.shard(r.shard)
        print(f"{r.job:<{jw}} {r.attempt:>4} {shard:>5} {host:<{hw}} {_fmt.timestamp(r.start):<19} {end:<19} "
              f"{_fmt.duration(r.duration_s):>9} {r.state:<9} {cpu:>9} {mem:>10} {gpu:>7} {exit_}")


def _host_label(host: str) -> str:
    """`ssh://me@gpu-box:2222` -> `gpu-box:2222`; `local` and other forms unchanged but for the scheme."""
    _, sep, rest = host.partition("://")
    if not sep:
        return host
    return rest.rpartition("@")[2].split("?", 1)[0] or host
