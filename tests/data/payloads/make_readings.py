"""Writes ``readings.jsonl``: event rows in every shape stores hold, each with how the hand-written
payload codecs of main at 3824fea read it (``repr`` of the payload: types and values, 1 and 1.0 told
apart).  Run once, before the codecs were derived; ``tests/test_payload_rows.py`` reads every row
back from stores of every schema version and compares.  Regenerate only where a reading changes on
purpose: ``python tests/data/payloads/make_readings.py``."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from supervisor.core.events import Event, EventKind
from supervisor.core.payloads import payload_of
from supervisor.store.database import Store

HERE = Path(__file__).resolve().parent

# Values of every JSON type and a few this version reads specially (the text of a number, an
# unknown enum value, a NaN): each is put under every key a payload reads.
BAD = ["x", "7", " 12 ", 1, 0, -3, 1.5, 2.0, True, False, None, [], [1, "a"], {}, {"a": 1}, "NaN",
       "a_value_from_the_future"]

# The keys each kind's payload reads (and a few it does not).
KEYS: dict[EventKind, list[str]] = {
    EventKind.PROGRESS: ["done", "total", "unit", "rate", "desc", "phase", "heartbeat", "paused", "tok_s", "loss"],
    EventKind.PHASE: ["implied_by", "phase"],
    EventKind.INFO: ["heartbeat", "paused", "sd_notify", "status"],
    EventKind.METRIC: ["gen_tps", "loss", "phase"],
    EventKind.FAILURE: ["failure", "fingerprint", "traceback", "level", "consequence", "exc_type"],
    EventKind.LAUNCHED: ["pid", "argv", "log", "host", "scheduler_id"],
    EventKind.EXITED: ["returncode", "signal"],
    EventKind.VERDICT: ["verdict", "bound_s", "probe"],
    EventKind.ACTION: ["reason", "held", "slow", "done", "total", "step_s", "slow_after_s", "history_p95_s",
                       "stall_bound_s", "bound_source", "probe", "bar", "phase", "down_s", "error",
                       "events_per_attempt", "terminated", "killed", "survivors", "reparented", "released",
                       "woken_by", "sample_ts", "waited_s", "moved_from", "moved_to", "left_out", "until",
                       "checkpoint", "params"],
    EventKind.GPU: ["anything"],
    EventKind.ALERT: ["kind", "severity", "evidence", "next", "pack", "reason"],
    EventKind.DAEMON_RESTARTED: ["down_s", "down_since", "pid"],
    EventKind.GPU_WAIT: ["holders"],
    EventKind.GPU_FAULT: ["gpu", "kind", "xid", "detail"],
    EventKind.STRAGGLER: ["probe", "bar", "process", "done", "total", "step_s", "rate_s", "peers_rate_s", "peers",
                          "factor", "steps", "pid", "host", "gpu"],
    EventKind.DISK_LOW: ["path", "free_mib", "total_mib", "warn_free_mib", "min_free_mib", "action"],
    EventKind.STACKS: ["note", "processes", "left_out", "flight_recorder", "dumps", "gpu_report"],
    EventKind.STATE: ["state", "reason"],
}

# Whole rows as producers wrote them, from the earliest versions on.
WHOLE: list[tuple[EventKind, Any]] = [
    (EventKind.PROGRESS, {"done": 3, "total": 8, "unit": "shards", "rate": 1.5, "desc": "Loading", "rank": 1}),
    (EventKind.PROGRESS, {"done": "7", "total": "not a number"}),
    (EventKind.PHASE, {}),
    (EventKind.PHASE, {"implied_by": "progress"}),
    (EventKind.INFO, {"sd_notify": "STATUS", "status": "serving"}),
    (EventKind.FAILURE, {"exc_type": "RuntimeError", "failure": "runtime_error", "fingerprint": "f",
                         "traceback": None, "level": "ERROR", "consequence": True}),
    (EventKind.LAUNCHED, {"pid": 12, "argv": ["python", "x.py", 3], "log": "/l", "host": "local",
                          "scheduler_id": None}),
    (EventKind.LAUNCHED, {"pid": 12}),
    (EventKind.EXITED, {"returncode": 1, "signal": None}),
    (EventKind.VERDICT, {"verdict": "stalled", "bound_s": 60.0, "bound_source": "default floor", "also": ["x"]}),
    (EventKind.ACTION, {"terminated": [[1, "python"]], "killed": [], "survivors": [], "reparented": [],
                        "released": True, "waited_s": 0.5}),
    (EventKind.ACTION, {"held": False, "slow": True, "probe": "p", "bar": "b", "done": 4, "total": None, "step_s": 9.0,
                        "slow_after_s": 5.0, "history_p95_s": 2.0, "stall_bound_s": 60.0,
                        "bound_source": "history (1 run)", "phase": "running"}),
    (EventKind.ACTION, {"moved_from": "a", "moved_to": "b", "left_out": [1, 2], "until": 5.0,
                        "checkpoint": "/ckpt/3", "params": {"lr": 1, 2: "x"}}),
    (EventKind.ALERT, {"kind": "crash", "severity": "error", "evidence": "e", "next": "relaunch"}),
    (EventKind.DAEMON_RESTARTED, {"down_s": 3, "down_since": 10.0, "pid": 4}),
    (EventKind.GPU_WAIT, {"holders": [{"pid": 1, "gpu": 0, "used_mib": 100, "command": "sleep"}, "junk",
                                      {"pid": "1", "gpu": None, "extra": 1}]}),
    (EventKind.GPU_FAULT, {"gpu": 0, "kind": "xid", "xid": 79, "detail": "fell off the bus"}),
    (EventKind.STRAGGLER, {"probe": "p", "bar": "b", "process": "rank=1", "done": 3, "total": 8, "step_s": 2,
                           "rate_s": 1.0, "peers_rate_s": 0.5, "peers": 7, "factor": 2.0, "steps": 5, "pid": 9,
                           "host": "h", "gpu": 1}),
    (EventKind.DISK_LOW, {"path": "/out", "free_mib": 10, "total_mib": 100, "warn_free_mib": 20, "min_free_mib": 5,
                          "action": "warned"}),
    (EventKind.STACKS, {"note": "", "processes": [{"pid": 1, "name": "python", "stack": "Thread 1", "error": None},
                                                  [1], {"pid": True}], "left_out": 3,
                        "flight_recorder": "rank 1 behind", "dumps": ["/d0", 1, "/d1"], "gpu_report": "/r"}),
    (EventKind.STATE, {"state": "running", "reason": "attempt 1"}),
    (EventKind.GPU, {"anything": 1}),
]

# data_json texts that are no JSON object (or no JSON at all): no producer writes them, a damaged
# store or a hand edit may hold them.
ODD_TEXTS = ["[1, 2]", '"text"', "null", "3", "not json", ""]


def rows() -> list[tuple[EventKind, str]]:
    made: list[tuple[EventKind, str]] = [(kind, json.dumps(data)) for kind, data in WHOLE]
    for kind, keys in KEYS.items():
        for key in keys:
            made += [(kind, json.dumps({key: value})) for value in BAD]
    made += [(kind, text) for kind in EventKind for text in ODD_TEXTS]
    made += [(EventKind.PROGRESS, json.dumps({"done": float("nan")}))]
    return made


def reading(kind: EventKind, text: str) -> dict[str, Any]:
    """How today's store and codecs read one row: the event's data and its payload, or that the
    store could not read it (then the payload of no data)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.db")
        store.record_events([Event(job="j", attempt=1, kind=kind, message="m")])
        store.close()
        with sqlite3.connect(Path(tmp) / "s.db") as db:
            db.execute("UPDATE events SET data_json=?", (text,))
        store = Store(Path(tmp) / "s.db")
        try:
            (event,) = store.events("j")
        except Exception as error:  # noqa: BLE001 - what today's store raised is what the row records
            return {"store_raised": type(error).__name__, "payload": repr(payload_of(kind, {}))}
        finally:
            store.close()
    return {"data": event.data, "payload": repr(payload_of(kind, event.data))}


def main() -> None:
    made = [{"kind": kind.value, "data_json": text, **reading(kind, text)} for kind, text in rows()]
    (HERE / "readings.jsonl").write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in made))
    print(len(made), "rows")


if __name__ == "__main__":
    main()
