"""`supervise probe LOG`: a finished log read offline through the probes.  It needs no daemon, so it
imports nothing of the client's (see ``cli._verb``)."""

from __future__ import annotations

import argparse
import time


def cmd_probe(args: argparse.Namespace) -> int:
    from supervisor.probes import probe_command

    if not args.stats:
        return probe_command(args.logfile, args.pack, args.pack_file, args.json)
    wall, cpu = time.perf_counter(), time.process_time()
    code = probe_command(args.logfile, args.pack, args.pack_file, args.json)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if code in (0, 1):  # the log was read
        _probe_stats(args, wall, cpu)
    return code


def _probe_stats(args: argparse.Namespace, wall: float, cpu: float) -> None:
    """``probe --stats``: which engine read the log, and how fast (on stderr: stdout may be JSON)."""
    import os
    import sys

    from supervisor.probes import ProbeEngine, load_packs

    reader = ProbeEngine(load_packs(args.pack or None, args.pack_file)).reader
    size = os.path.getsize(args.logfile)
    rate = f", {size / 1e6 / cpu:.1f} MB/s" if cpu > 0 else ""
    print(f"supervise probe: read by {reader}\nsupervise probe: {size / 1e6:.1f} MB in {wall:.2f} s "
          f"({cpu:.2f} s CPU{rate})", file=sys.stderr)
