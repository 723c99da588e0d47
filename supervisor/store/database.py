"""The store: SQLite in WAL mode, one transaction per state change.

Saved state lives here; live handles (tasks, followers, pidfds) live in the daemon.  A
probe event batch and the log offset it brings the attempt to are written in the same
transaction, so a daemon killed at any instant resumes at an offset that matches exactly
the events it had stored: none lost, none doubled.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from supervisor.core.actions import ActionKind
from supervisor.core.errors import NotFound, StoreBusy, StoreError, TransitionRefused
from supervisor.core.events import (
    AttemptState,
    Event,
    EventKind,
    Failure,
    JobState,
    Phase,
    Verdict,
    failure_kind,
)
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.progress import BarProgress
from supervisor.core.usage import AttemptUsage
from supervisor.spec.model import JobSpec, parse_stored
from supervisor.store import migration_notice
from supervisor.store.attempt_writes import FINAL_STATES, KEEP, AttemptEnd, AttemptUpdate
from supervisor.store.migration_notice import MigrationNotice
from supervisor.store.schema import MIGRATIONS as _MIGRATIONS

SCHEMA_VERSION = len(_MIGRATIONS)
log = structlog.get_logger("supervise.store")

# Attempts with their place in their run (1 for a run's first attempt), counted, never stored;
# a sharded job's shards each count their own (`IS`: NULL, an unsharded attempt, matches NULL).
_ATTEMPTS = ("SELECT a.*, (SELECT COUNT(*) FROM attempts p WHERE p.job = a.job AND p.run = a.run AND p.n <= a.n"
             " AND p.shard IS a.shard) AS run_attempt FROM attempts a")


@dataclass
class AttemptRow:
    job: str
    n: int
    tag: str
    host: str
    argv: list[str]
    workdir: str
    log_path: str
    status_path: str
    pid: int | None
    pgid: int | None
    start_time: float | None
    started: float
    ended: float | None
    state: AttemptState
    exit_code: int | None
    exit_signal: int | None
    log_offset: int
    phase: Phase | None
    progress: BarProgress | None  # its most recently moved bar, as last stored
    verdict: Verdict | None
    reason: str | None
    failure: Failure | None
    fingerprint: str | None
    action: str | None  # the sentence, as `attempts` and the API show it
    run: int = 1  # +1 at each `supervise start`; relaunches stay in their run
    run_attempt: int = 1  # its place in its run (read from the store, never written)
    log_generation: int = 0  # the log generation ``log_offset`` is in (see events.Record)
    scheduler_id: str | None = None  # a batch scheduler's id for it (a Slurm job id)
    shard: int | None = None  # a sharded job's shard index (-1: its gather step); None: unsharded
    usage: AttemptUsage | None = None  # what it used (CPU, memory, GPUs), stored as it ended
    checkpoint: str | None = None  # the checkpoint it was given as {last_checkpoint} (None: none)
    params: dict[str, str] | None = None  # its [params] as a `[restart.adjust]` rule changed them (None: the spec's)
    action_kind: ActionKind | None = None  # what was done when it ended (None: it has not ended)


@dataclass(frozen=True)
class EventQuery:
    """Which events a reader wants: the same filter for stored events and live ones."""

    job: str
    attempt: int | None = None
    min_attempt: int | None = None
    after_id: int = 0
    kinds: list[str] | None = None

    def matches(self, event: Event) -> bool:
        return (event.job == self.job and (event.id or 0) > self.after_id
                and (self.attempt is None or event.attempt == self.attempt)
                and (self.min_attempt is None or event.attempt >= self.min_attempt)
                and (not self.kinds or event.kind.value in self.kinds))


@dataclass
class JobRow:
    name: str
    stored: dict[str, Any]  # the spec as stored (JSON): what a change to it is measured against
    state: JobState
    reason: str
    created: float
    updated: float
    spec: JobSpec | None = None  # parsed once, as the row was read; None: it no longer validates
    spec_error: str | None = None  # why it no longer validates (shown by `status`); None: it does

    # What the views, the metrics and recovery ask of every job, its spec readable or not: of a
    # spec that no longer validates, what it stored, where that has the shape a spec gives it.

    @property
    def host(self) -> str:
        if self.spec is not None:
            return self.spec.host
        stored = self._stored("host")
        return stored if isinstance(stored, str) else LOCAL_HOST

    @property
    def shards(self) -> int:
        if self.spec is not None:
            return self.spec.shards
        stored = self._stored("shards")
        return stored if isinstance(stored, int) else 1

    @property
    def max_attempts(self) -> int:
        if self.spec is not None:
            return self.spec.restart.max_attempts
        restart = self._stored("restart")
        stored = restart["max_attempts"] if isinstance(restart, dict) and "max_attempts" in restart else None
        return stored if isinstance(stored, int) else 1

    @property
    def after(self) -> list[str]:
        """The jobs it runs after (a spec that no longer validates still waits on those it stored)."""
        if self.spec is not None:
            return list(self.spec.after)
        stored = self._stored("after")
        return [str(name) for name in stored] if isinstance(stored, list) else []

    def _stored(self, key: str) -> object:
        return self.stored.get(key)


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable against a killed process (the WAL is in the OS); only power loss can drop the tail.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")  # at start-up, nothing is served yet: waiting is fine
            self._specs: dict[str, tuple[str, dict[str, Any], JobSpec | str]] = {}
            self._migrate()
            # Then never: a lock held by another process (a `sqlite3` shell, a backup) would stop the
            # daemon's loop for as long as it is held.  Refused at once (StoreBusy), a write is kept
            # and tried again by its caller (jobs/pending.py), a read is answered "store busy".
            self._db.execute("PRAGMA busy_timeout=0")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"cannot create the store's directory {path.parent}: {exc.strerror}") from exc

    @classmethod
    def reader(cls, path: Path) -> Store:
        """A second, read-only connection to the same file, for reads done in a thread (the
        daemon's own connection is the loop's).  WAL: it never waits on the writer."""
        store = cls.__new__(cls)
        store.path = path
        try:
            store._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {path}: {exc}") from exc
        store._db.row_factory = sqlite3.Row
        store._db.execute("PRAGMA busy_timeout=0")
        store._specs = {}
        return store

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:  # a COMMIT refused leaves it open: the next BEGIN would fail
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            if _busy(exc):
                raise StoreBusy(f"store busy: another process holds the write lock on {self.path} (a `sqlite3` "
                                "shell, a backup?); nothing stored was lost, try again once it lets go") from exc
            raise StoreError(f"store write failed ({self.path}): {exc}; free disk space, nothing stored was lost") from exc

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        """The rows of one query; a lock another process holds is StoreBusy, at once."""
        try:
            return self._db.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as exc:
            if _busy(exc):
                raise StoreBusy(f"store busy: another process holds a lock on {self.path}; try again") from exc
            raise StoreError(f"store read failed ({self.path}): {exc}") from exc

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this supervise ({SCHEMA_VERSION}): upgrade supervise"
            )
        if version == SCHEMA_VERSION:
            return
        # A new store is made in milliseconds; an old one may take minutes: said in the log, step by
        # step, and to a client waiting for the daemon to listen (migration_notice).
        existing = version > 0
        if existing:
            events = self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            notice = MigrationNotice(os.getpid(), version, SCHEMA_VERSION, events, time.time())
            log.info("migrating the store", path=str(self.path), schema_from=version, schema_to=SCHEMA_VERSION,
                     events=events)
            migration_notice.announce(self.path, notice)
        began = time.monotonic()
        try:
            for target in range(version, SCHEMA_VERSION):
                step = time.monotonic()
                with self._tx() as db:
                    for statement in _MIGRATIONS[target].split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version={target + 1}")
                if existing:
                    log.info("store migration step done", schema=target + 1, of=SCHEMA_VERSION,
                             seconds=round(time.monotonic() - step, 2))
        finally:
            if existing:
                migration_notice.withdraw(self.path)
        if existing:
            log.info("store migrated", schema=SCHEMA_VERSION, seconds=round(time.monotonic() - began, 2))

    # -- jobs -------------------------------------------------------------------------

    def upsert_job(self, name: str, spec: dict[str, Any], state: JobState, reason: str = "") -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs(name, spec_json, state, reason, created, updated) VALUES(?,?,?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET spec_json=excluded.spec_json, state=excluded.state, "
                "reason=excluded.reason, updated=excluded.updated",
                (name, json.dumps(spec), state, reason, now, now),
            )

    def job(self, name: str) -> JobRow:
        rows = self._read("SELECT * FROM jobs WHERE name=?", (name,))
        if not rows:
            raise NotFound(f"no job named '{name}'; `supervise jobs` lists the known ones")
        return self._job_row(rows[0])

    def jobs(self) -> list[JobRow]:
        return [self._job_row(r) for r in self._read("SELECT * FROM jobs ORDER BY name")]

    def _job_row(self, row: sqlite3.Row) -> JobRow:
        """A job's row with its spec parsed: once for each spec stored (a spec may be 1 MiB, and
        `status` reads every job's row each time), kept while the stored text stays the same."""
        name, text = row["name"], row["spec_json"]
        kept = self._specs.get(name)
        if kept is None or kept[0] != text:
            # The JSON too is decoded once per stored text: each `status` read every job's row, and
            # decoding eight specs was a fifth of its time.  Every row of that text shares the dict
            # (read, never changed: a change is a new upsert_job, a new text).
            stored = json.loads(text)
            kept = self._specs[name] = (text, stored, parse_stored(stored))
        stored, parsed = kept[1], kept[2]
        return JobRow(name, stored, JobState(row["state"]), row["reason"], row["created"], row["updated"],
                      spec=parsed if isinstance(parsed, JobSpec) else None,
                      spec_error=parsed if isinstance(parsed, str) else None)

    def job_names(self) -> list[str]:
        return [str(r["name"]) for r in self._read("SELECT name FROM jobs ORDER BY name")]

    def delete_job(self, name: str) -> None:
        """Forget a job: its row, its attempts, its events and its bar paces, in one transaction."""
        self.job(name)
        with self._tx() as db:
            db.execute("DELETE FROM events WHERE job=?", (name,))
            db.execute("DELETE FROM attempts WHERE job=?", (name,))
            db.execute("DELETE FROM bar_paces WHERE job=?", (name,))
            db.execute("DELETE FROM jobs WHERE name=?", (name,))
        self._specs.pop(name, None)

    def delete_events(self, job: str, attempts: Iterable[int], kinds: Iterable[str]) -> int:
        """Delete the events of these kinds of these attempts of a job; how many went."""
        pairs = [(job, n, kind) for n in attempts for kind in kinds]
        with self._tx() as db:
            before = db.total_changes
            db.executemany("DELETE FROM events WHERE job=? AND attempt=? AND kind=?", pairs)
            return db.total_changes - before

    # -- attempts ---------------------------------------------------------------------

    def next_attempt_number(self, job: str) -> int:
        return (self._read("SELECT MAX(n) FROM attempts WHERE job=?", (job,))[0][0] or 0) + 1

    def next_run_number(self, job: str) -> int:
        return (self._read("SELECT MAX(run) FROM attempts WHERE job=?", (job,))[0][0] or 0) + 1

    def add_attempt(self, row: AttemptRow) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO attempts(job, n, tag, host, argv_json, workdir, log_path, status_path, pid, pgid, "
                "start_time, started, state, log_offset, run, shard, checkpoint, params_json) "
                "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.job, row.n, row.tag, row.host, json.dumps(row.argv), row.workdir, row.log_path,
                 row.status_path, row.pid, row.pgid, row.start_time, row.started, row.state, row.log_offset,
                 row.run, row.shard, row.checkpoint, None if row.params is None else json.dumps(row.params)),
            )

    def update_attempt(self, job: str, n: int, update: AttemptUpdate) -> None:
        """Store what ``update`` gives of a live attempt's row (nothing else of it changes)."""
        columns = _update_columns(update)
        if columns:
            with self._tx() as db:
                _set_columns(db, job, n, columns)

    def attempt_running(self, job: str, n: int, update: AttemptUpdate) -> None:
        """The attempt was launched: running, with its process (``update``).  Refused
        (TransitionRefused) for an attempt whose end is stored already."""
        with self._tx() as db:
            _refuse_after_end(db, job, n, AttemptState.RUNNING)
            _set_columns(db, job, n, {**_update_columns(update), "state": AttemptState.RUNNING.value})

    def end_attempt(self, end: AttemptEnd, events: Iterable[Event], *, job: str, n: int) -> list[Event]:
        """The attempt's end and the events that tell it, in one transaction (its time stamped
        now unless ``end`` gives it).  Refused (TransitionRefused, nothing stored) for an attempt
        whose end is stored already: an end is written once."""
        stored = list(events)
        with self._tx() as db:
            _refuse_after_end(db, job, n, end.state)
            _set_columns(db, job, n, _end_columns(end, time.time()))
            _insert_events(db, stored)
        return stored

    def attempt(self, job: str, n: int) -> AttemptRow:
        rows = self._read(f"{_ATTEMPTS} WHERE a.job=? AND a.n=?", (job, n))
        if not rows:
            raise NotFound(f"job '{job}' has no attempt {n}; `supervise attempts {job}` lists them")
        return _attempt_row(rows[0])

    def attempts(self, job: str) -> list[AttemptRow]:
        return [_attempt_row(r) for r in self._read(f"{_ATTEMPTS} WHERE a.job=? ORDER BY a.n", (job,))]

    def latest_attempt(self, job: str) -> AttemptRow | None:
        rows = self._read(f"{_ATTEMPTS} WHERE a.job=? ORDER BY a.n DESC LIMIT 1", (job,))
        return _attempt_row(rows[0]) if rows else None

    def latest_attempts(self) -> dict[str, AttemptRow]:
        """Every job's latest attempt, by job, in one query: what `status` shows of each job (a
        query per job, each a wait for the GIL when it comes back, made `status` wait behind the
        matcher's thread once per job while busy logs were read)."""
        rows = self._read(f"{_ATTEMPTS} WHERE a.n = (SELECT MAX(m.n) FROM attempts m WHERE m.job = a.job)")
        return {row.job: row for row in map(_attempt_row, rows)}

    def live_attempts(self) -> list[AttemptRow]:
        live = [state.value for state in AttemptState if state.active]
        rows = self._read(f"{_ATTEMPTS} WHERE a.state IN ({','.join('?' * len(live))}) ORDER BY a.job, a.n", live)
        return [_attempt_row(r) for r in rows]

    # -- events -----------------------------------------------------------------------

    def record_events(self, events: Iterable[Event], *, offset: int | None = None, update: AttemptUpdate | None = None,
                      replaced: Iterable[int] = (), job_state: tuple[JobState, str] | None = None) -> list[Event]:
        """Store events (assigning ids) and, in the same transaction, what they bring their
        attempt to (its new log ``offset``; ``update``: its phase, progress); ``replaced``: ids of progress
        events the new ones stand in for (a bar's latest line, jobs/milestones.py), deleted;
        ``job_state``: the job's new state and reason (nothing is stored for a job forgotten)."""
        stored = list(events)
        with self._tx() as db:
            if job_state is not None and stored and not db.execute(
                    "UPDATE jobs SET state=?, reason=?, updated=? WHERE name=?",
                    (*job_state, time.time(), stored[0].job)).rowcount:
                return []
            db.executemany("DELETE FROM events WHERE id = ? AND kind = 'progress'", [(i,) for i in replaced])
            _insert_events(db, stored)
            columns = _update_columns(update) if update is not None else {}
            if offset is not None:
                columns["log_offset"] = offset
            if stored and columns:
                _set_columns(db, stored[0].job, stored[0].attempt, columns)
        return stored

    def events(self, job: str, *, attempt: int | None = None, after_id: int = 0,
               kinds: list[str] | None = None, min_attempt: int | None = None, limit: int = 10_000,
               latest: bool = False) -> list[Event]:
        return self.query_events(EventQuery(job, attempt, min_attempt, after_id, kinds), limit, latest=latest)

    def query_events(self, query: EventQuery, limit: int = 10_000, *, latest: bool = False) -> list[Event]:
        """The first ``limit`` events that match, in id order; ``latest``: the last ``limit``."""
        sql = "SELECT * FROM events WHERE job=? AND id>?"
        args: list[Any] = [query.job, query.after_id]
        if query.attempt is not None:
            sql += " AND attempt=?"
            args.append(query.attempt)
        if query.min_attempt is not None:
            sql += " AND attempt>=?"
            args.append(query.min_attempt)
        kinds = query.kinds
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args.extend(kinds)
        sql += f" ORDER BY id {'DESC' if latest else 'ASC'} LIMIT ?"
        args.append(limit)
        found = [_event(r) for r in self._read(sql, args)]
        return found[::-1] if latest else found

    def count_events(self, query: EventQuery) -> dict[str, int]:
        """How many events match ``query`` (job, after_id and attempt), by kind."""
        if query.attempt is not None:
            rows = self._read("SELECT kind, COUNT(*) FROM events WHERE job=? AND attempt=? AND id>? GROUP BY kind",
                              (query.job, query.attempt, query.after_id))
        else:
            rows = self._read("SELECT kind, COUNT(*) FROM events WHERE job=? AND id>? GROUP BY kind",
                              (query.job, query.after_id))
        return {row[0]: int(row[1]) for row in rows}

    # -- the daemon's heartbeat ----------------------------------------------------------

    def beat(self, ts: float) -> None:
        """The daemon is alive at ``ts`` (wall clock)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO daemon_heartbeat(id, ts) VALUES(1, ?)", (ts,))

    def last_beat(self) -> float | None:
        """When a daemon was last known alive (None: never, in this store)."""
        rows = self._read("SELECT ts FROM daemon_heartbeat WHERE id=1")
        return float(rows[0][0]) if rows else None

    # -- GPU samples ------------------------------------------------------------------

    def record_gpu(self, host: str, ts: float, rows: Iterable[tuple[int, int, int, int | None]]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO gpu_samples(ts, host, gpu, used_mib, total_mib, util_pct) VALUES(?,?,?,?,?,?)",
                [(ts, host, gpu, used, total, util) for gpu, used, total, util in rows],
            )

    def gpu_history(self, host: str, since: float) -> list[tuple[float, int, int, int]]:
        rows = self._read(
            "SELECT ts, gpu, used_mib, total_mib FROM gpu_samples WHERE host=? AND ts>=? ORDER BY ts", (host, since)
        )
        return [tuple(r) for r in rows]


def _busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused because another connection holds a lock (SQLITE_BUSY, SQLITE_LOCKED)."""
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or \
        "database is locked" in str(exc)


def _insert_events(db: sqlite3.Connection, events: list[Event]) -> None:
    """Insert events, each given its id (None: the same probe line was stored already)."""
    for event in events:
        cur = db.execute(
            "INSERT OR IGNORE INTO events(job, attempt, ts, kind, probe, phase, log_offset, log_generation, "
            "message, data_json) VALUES(?,?,?,?,?,?,?,?,?,?)",
            (event.job, event.attempt, event.ts, event.kind.value, event.probe,
             event.phase.value if event.phase else None, event.offset, event.generation, event.message,
             json.dumps(_event_data(event), default=str)),
        )
        event.id = cur.lastrowid if cur.rowcount else None  # None: already stored


SqlValue = str | int | float | None

# Each AttemptUpdate field's column: its own name, but for the values stored as JSON.
_JSON_COLUMNS = {"progress": "progress_json", "failure": "failure_json", "usage": "usage_json"}
_UPDATE_COLUMNS = tuple((name, _JSON_COLUMNS.get(name, name)) for name in AttemptUpdate.__dataclass_fields__)


def _update_columns(update: AttemptUpdate) -> dict[str, SqlValue]:
    """The columns an update writes (the fields it gives), with their stored values."""
    found: dict[str, SqlValue] = {}
    for name, column in _UPDATE_COLUMNS:
        value = getattr(update, name)
        if value is not KEEP:
            found[column] = _stored(value)
    return found


def _end_columns(end: AttemptEnd, now: float) -> dict[str, SqlValue]:
    """The columns an end writes: its exit status only where it is known (else what is stored stays)."""
    found: dict[str, SqlValue] = {
        "state": end.state.value, "ended": end.at if end.at is not None else now, "reason": end.reason,
        "verdict": end.verdict.value if end.verdict is not None else None,
        "action": end.action.text if end.action is not None else None,
        "action_kind": end.action.kind.value if end.action is not None else None,
    }
    if end.exit is not None:
        found["exit_code"], found["exit_signal"] = end.exit.code, end.exit.signal
    return found


def _stored(value: object) -> SqlValue:
    if isinstance(value, Failure | BarProgress):
        return json.dumps(value.to_json())
    if isinstance(value, AttemptUsage):
        return json.dumps(value.model_dump(mode="json"))
    if isinstance(value, Phase | Verdict):
        return value.value
    assert value is None or isinstance(value, str | int | float)
    return value


def _set_columns(db: sqlite3.Connection, job: str, n: int, columns: dict[str, SqlValue]) -> None:
    """One attempt's columns (names from attempt_writes.py's values, never from a caller)."""
    if columns:
        sets = ", ".join(f"{column}=?" for column in columns)
        db.execute(f"UPDATE attempts SET {sets} WHERE job=? AND n=?", (*columns.values(), job, n))


def _refuse_after_end(db: sqlite3.Connection, job: str, n: int, to: AttemptState) -> None:
    """TransitionRefused if the attempt's stored state is an end (ended, stopped): none is left."""
    row = db.execute("SELECT state FROM attempts WHERE job=? AND n=?", (job, n)).fetchone()
    if row is not None and AttemptState(row[0]) in FINAL_STATES:
        raise TransitionRefused(f"attempt {n} of job '{job}' is {row[0]} already: it cannot become {to.value}")


def _attempt_row(row: sqlite3.Row) -> AttemptRow:
    def load(text: str | None) -> Any:
        return json.loads(text) if text else None

    return AttemptRow(
        job=row["job"], n=row["n"], tag=row["tag"], host=row["host"], argv=json.loads(row["argv_json"]),
        workdir=row["workdir"], log_path=row["log_path"], status_path=row["status_path"], pid=row["pid"],
        pgid=row["pgid"], start_time=row["start_time"], started=row["started"], ended=row["ended"],
        state=AttemptState(row["state"]), exit_code=row["exit_code"], exit_signal=row["exit_signal"],
        log_offset=row["log_offset"], phase=Phase(row["phase"]) if row["phase"] else None,
        progress=BarProgress.from_json(load(row["progress_json"])), verdict=Verdict(row["verdict"]) if row["verdict"] else None,
        reason=row["reason"], failure=_failure(load(row["failure_json"])), fingerprint=row["fingerprint"],
        action=row["action"], run=row["run"], run_attempt=row["run_attempt"],
        log_generation=row["log_generation"], scheduler_id=row["scheduler_id"], shard=row["shard"],
        usage=_usage(row["usage_json"]), checkpoint=row["checkpoint"], params=load(row["params_json"]),
        action_kind=_action_kind(row["action_kind"]),
    )


def _action_kind(text: str | None) -> ActionKind | None:
    if text is None:
        return None
    try:
        return ActionKind(text)
    except ValueError:  # a kind written by a later version: nothing this one acts on
        return ActionKind.NONE


def _usage(text: str | None) -> AttemptUsage | None:
    if not text:
        return None
    try:
        return AttemptUsage.model_validate_json(text)
    except ValueError:  # a row written by a later version with fields this one does not know
        return None


def _failure(data: dict[str, Any] | None) -> Failure | None:
    return None if data is None else Failure.from_json(data)


# A failure event's Failure is stored among its data, under these keys (the shape stores have
# always had: the kind under "failure", the line as the event's message).
_FAILURE_KEYS = ("failure", "fingerprint", "traceback", "level", "consequence")


def _event_data(event: Event) -> dict[str, Any]:
    failure = event.failure
    if failure is None:
        return event.data
    stored = {**event.data, "failure": failure.kind.value, "fingerprint": failure.fingerprint,
              "traceback": failure.traceback}
    if failure.level is not None:
        stored["level"] = failure.level
    if failure.consequence:
        stored["consequence"] = True
    return stored


def _stored_data(text: str) -> dict[str, Any]:
    """A row's data as a mapping: text that is no JSON object (a damaged row, a hand edit) reads as
    no data, so that the event is still read and shown, its payload read as absent."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _event(row: sqlite3.Row) -> Event:
    kind = EventKind(row["kind"])
    data = _stored_data(row["data_json"])
    failure = None
    if kind is EventKind.FAILURE:
        found = {key: data.pop(key) for key in _FAILURE_KEYS if key in data}
        failure = Failure(kind=failure_kind(found.get("failure")), line=row["message"],
                          fingerprint=found.get("fingerprint"), traceback=found.get("traceback"),
                          level=found.get("level"), consequence=bool(found.get("consequence", False)))
    return Event(
        job=row["job"], attempt=row["attempt"], kind=kind, message=row["message"],
        ts=row["ts"], probe=row["probe"], phase=Phase(row["phase"]) if row["phase"] else None,
        offset=row["log_offset"], generation=row["log_generation"], data=data, id=row["id"], failure=failure,
    )
