"""Arrival stampers for the benchmarks: note ``time.time()`` the moment something shows up.

    _stamp.py stdin OUT              lines on stdin (a shell pipeline's output)
    _stamp.py events HOME JOB OUT    progress and metric events streamed by the daemon (`supervise events -f`)
    _stamp.py commits DB OUT         progress and metric events as they become visible in the store to
                                     another reader (inotify on the WAL file, then a query)

Each writes ``OUT.ready`` once it listens, keeps ``arrival<TAB>text`` lines in memory and
writes them to OUT when its input ends or on SIGTERM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import sqlite3
import sys
import time
from pathlib import Path

IN_MODIFY = 0x00000002
arrivals: list[tuple[float, str]] = []


def ready(out: Path) -> None:
    Path(str(out) + ".ready").write_text("")


def from_stdin(out: Path) -> None:
    stream = sys.stdin.buffer
    ready(out)
    while True:
        line = stream.readline()
        now = time.time()
        if not line:
            return
        arrivals.append((now, line.decode(errors="replace").rstrip("\n")))


def from_events(home: str, job: str, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from supervisor.cli.client import Client
    from supervisor.core.config import Paths

    client = Client(Paths(Path(home)), timeout_s=60)
    ready(out)
    for event in client.follow_events(job, kinds=["progress", "metric"]):
        arrivals.append((time.time(), event.message))


def from_commits(db_path: str, out: Path) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, (db_path + "-wal").encode(), IN_MODIFY) < 0:
        raise SystemExit(f"cannot watch {db_path}-wal: errno {ctypes.get_errno()}")
    # A plain connection (only reads): a read-only one cannot share the WAL index and rebuilds it per query.
    db = sqlite3.connect(db_path, isolation_level=None)
    last = db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    ready(out)
    while True:
        poller.poll()
        os.read(fd, 65536)
        # The WAL is written before the commit is published in the shared index (a memory
        # map, which inotify does not see): look again briefly until the commit shows.
        give_up = time.monotonic() + 0.02
        while True:
            rows = db.execute("SELECT id, kind, message FROM events WHERE id > ? ORDER BY id", (last,)).fetchall()
            if rows or time.monotonic() > give_up:
                break
            time.sleep(0.0001)
        now = time.time()
        for row_id, kind, message in rows:
            if kind in ("progress", "metric"):
                arrivals.append((now, message))
            last = row_id


def main() -> int:
    mode, *rest = sys.argv[1:]
    out = Path(rest[-1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if mode == "stdin":
            from_stdin(out)
        elif mode == "events":
            from_events(rest[0], rest[1], out)
        elif mode == "commits":
            from_commits(rest[0], out)
        else:
            raise SystemExit(f"unknown mode {mode}")
    except KeyboardInterrupt:
        pass
    finally:
        with open(out, "w") as handle:
            handle.writelines(f"{t:.6f}\t{text}\n" for t, text in arrivals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
