"""The pipelines table (its migration is in store/schema.py): which steps a pipeline has, in order,
the job each runs as, and which its last start skipped.  The steps' states are their jobs'."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from supervisor.store.database import Store


@dataclass(frozen=True)
class StepRow:
    step: str
    job: str
    skipped: bool  # done already with the same inputs when the pipeline was last started


@dataclass(frozen=True)
class PipelineRow:
    name: str
    spec_path: str
    overrides: dict[str, str]
    steps: tuple[StepRow, ...]
    started: float


class PipelineStore:
    """Pipelines in the daemon's store (same database, same transactions)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def save(self, name: str, spec_path: str, overrides: dict[str, str], steps: list[StepRow]) -> None:
        with self.store._tx() as db:  # store/schema.py holds the schema; the table's rows are this module's
            db.execute("INSERT INTO pipelines(name, spec_path, overrides_json, steps_json, started) VALUES(?,?,?,?,?) "
                       "ON CONFLICT(name) DO UPDATE SET spec_path=excluded.spec_path, overrides_json=excluded.overrides_json, "
                       "steps_json=excluded.steps_json, started=excluded.started",
                       (name, spec_path, json.dumps(overrides), json.dumps([asdict(s) for s in steps]), time.time()))

    def all(self) -> list[PipelineRow]:
        rows = self.store._read("SELECT * FROM pipelines ORDER BY name")
        return [PipelineRow(name=r["name"], spec_path=r["spec_path"], overrides=json.loads(r["overrides_json"]),
                            steps=tuple(StepRow(**s) for s in json.loads(r["steps_json"])), started=r["started"])
                for r in rows]
