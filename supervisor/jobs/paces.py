"""The bar_paces table (its migration is in store/schema.py): each bar's intervals as an attempt
measured them, kept so that the next attempt of the same job, with the same spec on the same
kind of host, starts its stall bounds from what was seen (``watchdog.PaceHistory``)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict

from supervisor.spec.model import JobSpec
from supervisor.store.database import Store
from supervisor.watchdog import BarPace, PaceHistory

# The latest attempts whose intervals make a bar's history: enough to span a few relaunches,
# few enough that a job whose pace changed (a new disk) forgets the old one soon.
_RUNS_KEPT = 5


def spec_fingerprint(spec: JobSpec) -> str:
    """What makes two attempts the same work: the command (model and arguments), interpreter,
    directory, environment and parameters.  Another model or another batch size is another pace."""
    launch = {"command": spec.command, "python": spec.python, "workdir": spec.workdir, "env": spec.env,
              "params": spec.params, "shard": spec.shard_index}
    return hashlib.sha256(json.dumps(launch, sort_keys=True).encode()).hexdigest()[:16]


class PaceStore:
    """Bar paces in the daemon's store (same database, same transactions)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def save(self, job: str, fingerprint: str, host_kind: str, attempt: int, paces: dict[str, list[float]]) -> None:
        """An attempt's intervals, by bar key; saved again (replaced) as the attempt goes on."""
        rows = [(job, fingerprint, host_kind, bar, attempt, json.dumps([round(v, 4) for v in values]), time.time())
                for bar, values in paces.items() if values]
        if not rows:
            return
        with self.store._tx() as db:  # store/schema.py holds the schema; the table's rows are this module's
            db.executemany("INSERT OR REPLACE INTO bar_paces(job, spec_fingerprint, host_kind, bar, attempt, "
                           "intervals_json, recorded) VALUES(?,?,?,?,?,?,?)", rows)
            # Older runs of the same bar beyond the kept ones are of no further use.
            db.execute("DELETE FROM bar_paces WHERE job=? AND attempt <= ? - ?", (job, attempt, 4 * _RUNS_KEPT))

    def history(self, job: str, fingerprint: str, host_kind: str, *, before: int | None = None) -> PaceHistory:
        """Each bar's intervals over the latest ``_RUNS_KEPT`` attempts (before attempt ``before``)."""
        rows = self.store._read(
            "SELECT bar, attempt, intervals_json FROM bar_paces WHERE job=? AND spec_fingerprint=? AND host_kind=? "
            "AND attempt < ? ORDER BY attempt DESC",
            (job, fingerprint, host_kind, before if before is not None else 1 << 62))
        runs: dict[str, list[list[float]]] = defaultdict(list)
        for row in rows:
            if len(runs[row["bar"]]) < _RUNS_KEPT:
                runs[row["bar"]].append([float(v) for v in json.loads(row["intervals_json"])])
        return PaceHistory({bar: BarPace.of(bar, kept) for bar, kept in runs.items()})
