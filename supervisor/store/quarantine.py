"""The quarantine table (its migration is in store/schema.py): the GPUs and hosts jobs are kept
away from, each until its expiry.  A row is replaced when the same GPU or host is quarantined
again (the later expiry wins: a new fault starts its time again)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.store.database import Store


@dataclass(frozen=True)
class Quarantine:
    host: str
    gpu: int | None  # None: the whole host
    reason: str
    since: float  # wall clock
    until: float  # wall clock: past it, the GPU or host is used again

    @property
    def place(self) -> str:
        """`HOST` or `HOST:GPU`: what `supervise quarantine --clear` takes."""
        return self.host if self.gpu is None else f"{self.host}:{self.gpu}"


class QuarantineStore:
    """Quarantine rows in the daemon's store (same database, same transactions)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, entry: Quarantine) -> None:
        with self.store._tx() as db:  # store/schema.py holds the schema; the table's rows are this module's
            db.execute("DELETE FROM quarantine WHERE host=? AND COALESCE(gpu, -1)=?",
                       (entry.host, -1 if entry.gpu is None else entry.gpu))
            db.execute("INSERT INTO quarantine(host, gpu, reason, since, until) VALUES(?,?,?,?,?)",
                       (entry.host, entry.gpu, entry.reason, entry.since, entry.until))

    def active(self, now: float) -> list[Quarantine]:
        """Those not expired at ``now``, by host then GPU (the host's own row first)."""
        rows = self.store._read("SELECT host, gpu, reason, since, until FROM quarantine WHERE until > ? "
                                "ORDER BY host, COALESCE(gpu, -1)", (now,))
        return [Quarantine(r["host"], r["gpu"], r["reason"], float(r["since"]), float(r["until"])) for r in rows]

    def clear(self, host: str, gpu: int | None, *, whole_host: bool) -> int:
        """Lift the quarantine of ``host:gpu`` (``whole_host``: the host's and each of its GPUs');
        how many rows went."""
        with self.store._tx() as db:
            if whole_host:
                cursor = db.execute("DELETE FROM quarantine WHERE host=?", (host,))
            else:
                cursor = db.execute("DELETE FROM quarantine WHERE host=? AND gpu=?", (host, gpu))
            return int(cursor.rowcount)

    def prune(self, now: float) -> None:
        """Expired rows are of no further use."""
        with self.store._tx() as db:
            db.execute("DELETE FROM quarantine WHERE until <= ?", (now,))
