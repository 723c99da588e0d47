"""Another process holding the store's write lock (a `sqlite3` shell's BEGIN IMMEDIATE, a backup)
while a job runs and prints: the daemon keeps answering, a verb that must write says "store busy"
(exit 74), and once the lock is let go every event is stored, none lost, none doubled."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import PROGRESS_JOB, job_state, probe_events, supervise

# A real second process on the daemon's store: it takes the write lock, says so, holds it, lets go.
LOCK_HOLDER = """\
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""

HOLD_S = 12.0  # long enough for two CLI calls on a loaded 2-core machine


def _hold_lock(db: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(db), str(HOLD_S)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_held_store_lock_freezes_nothing_and_loses_nothing(daemon: DaemonProcess, make_job, daemon_env,
                                                              home: Path) -> None:
    # 60 steps, 0.15 s apart (9 s): the lock is taken after a few and held while it prints on (and ends).
    spec = make_job("held", PROGRESS_JOB, params=', "60", "0.15"')
    other = make_job("other", PROGRESS_JOB, params=', "3", "0.01"')
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: any(e.kind == "progress" and e.data.get("done", 0) >= 3 for e in client.events("held").events))

    holder = _hold_lock(home / "supervise.db")
    try:
        time.sleep(0.5)  # the daemon has tried to store a few batches by now
        status = supervise(daemon_env, "status", "held", check=False)
        # Answered while the lock is still held (a frozen loop answers only once it is let go).
        assert holder.poll() is None, "status answered only after the lock was let go"
        assert status.returncode == 0 and "held" in status.stdout, status.stdout + status.stderr
        # A verb that must write cannot: one line, "store busy", 74, and nothing of it stored.
        refused = supervise(daemon_env, "start", str(other), check=False)
        assert holder.poll() is None, "start answered only after the lock was let go"
        assert refused.returncode == 74, refused.stdout + refused.stderr
        assert "store busy" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert client.ping() is not None
    finally:
        holder.communicate(timeout=30)
    assert holder.returncode == 0

    wait_until(lambda: job_state(client, "held") == "done", timeout=60)
    done = [d for _, _, d in probe_events(client, "held") if d is not None]
    assert done == list(range(1, 61))  # none lost, none doubled
    assert "other" not in [j.name for j in client.status().jobs]
