"""A store migration under way, said to whoever waits for the daemon.

A daemon opens its store before it listens, and an old store is migrated first: a migration of
a large store (1.2M events: 37 s) left the first CLI call to report that the daemon "did not
start" while it was busy doing so, and nothing in its log said why.  The daemon writes this file
beside the store while it migrates (and logs each step); a client that waits for the daemon to
listen reads it, says what is happening, and waits for as long as the daemon that wrote it lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MigrationNotice:
    pid: int
    schema_from: int
    schema_to: int
    events: int  # the events stored: what makes a migration long
    started: float  # wall clock

    def describe(self, now: float | None = None) -> str:
        took = (time.time() if now is None else now) - self.started
        return (f"the daemon (pid {self.pid}) is migrating its store from schema {self.schema_from} to "
                f"{self.schema_to} ({self.events:,} events), for {max(0.0, took):.0f}s so far")


def notice_path(db: Path) -> Path:
    return db.with_name(db.name + ".migrating")


def announce(db: Path, notice: MigrationNotice) -> None:
    """Best effort: a notice that cannot be written costs a waiting client its explanation only."""
    with contextlib.suppress(OSError):
        notice_path(db).write_text(json.dumps(notice.__dict__))


def withdraw(db: Path) -> None:
    with contextlib.suppress(OSError):
        notice_path(db).unlink(missing_ok=True)


def current(db: Path) -> MigrationNotice | None:
    """The notice of a migration under way: None when there is none, or its daemon is gone (killed
    mid-migration: SQLite rolled its step back, and the next daemon starts it again)."""
    try:
        raw = json.loads(notice_path(db).read_text())
        notice = MigrationNotice(int(raw["pid"]), int(raw["schema_from"]), int(raw["schema_to"]), int(raw["events"]),
                                 float(raw["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(notice.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's: said all the same
    return notice
