"""What today's probe engine reads from every corpus log, as a comparable snapshot.

The snapshot of a log holds, for the daemon's way of reading (``RecordBuffer`` fed in small
chunks, ``ProbeEngine.feed_many`` per chunk, ``flush`` at the end): every event (kind, probe,
offset, line, phase, failure, fields) and, after every chunk, the records' end, the engine's
``resume_offset`` and whether a traceback is open; the same events again from a fresh engine
fed one record at a time and from one resumed at every resume point; and the offline report
(``replay_file(...).to_json()``).  tests/test_probes_golden.py compares the engine against
the stored file; regenerate it only for an intended change of behaviour:

    PYTHONPATH=$PWD .venv/bin/python tests/probe_golden.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from supervisor.core.events import ProbeEvent
from supervisor.core.records import RecordBuffer
from supervisor.probes import ProbeEngine, load_packs
from supervisor.probes._replay import replay_file

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "corpus"
GOLDEN = DATA / "probe_golden.jsonl"
CHUNK = 701  # small and odd: records and tracebacks straddle the chunks


def corpus_logs() -> list[Path]:
    return sorted(CORPUS.rglob("*.log"))


def event_json(event: ProbeEvent) -> dict[str, Any]:
    return {"kind": event.kind.value, "probe": event.probe, "offset": event.offset, "line": event.line,
            "phase": event.phase.value if event.phase else None,
            "failure": event.failure.to_json() if event.failure else None,
            "fields": event.fields}


_PACKS: list[Any] = []


def packs() -> list[Any]:
    if not _PACKS:
        _PACKS.extend(load_packs())
    return _PACKS


Point = tuple[int, int, bool, int]  # records' end, resume offset, open traceback, events so far


def _follow(data: bytes, start: int = 0) -> tuple[list[ProbeEvent], list[Point]]:
    """Events, and a ``Point`` after every chunk, reading from ``start``."""
    engine = ProbeEngine(packs(), start_offset=start)
    buffer = RecordBuffer(start)
    events: list[ProbeEvent] = []
    points: list[tuple[int, int, bool]] = []
    for pos in range(start, len(data), CHUNK):
        events += engine.feed_many(buffer.feed(data[pos:pos + CHUNK]))
        points.append((buffer.offset, engine.resume_offset, engine.has_open_traceback, len(events)))
    events += engine.feed_many(buffer.flush())
    events += engine.flush()
    return events, points


def _one_by_one(data: bytes) -> list[ProbeEvent]:
    engine = ProbeEngine(packs())
    buffer = RecordBuffer()
    events: list[ProbeEvent] = []
    for record in buffer.feed(data) + buffer.flush():
        events += engine.feed(record)
    return events + engine.flush()


def _resumed(data: bytes, events: list[ProbeEvent], points: list[Point]) -> list[tuple[int, bool, str]]:
    """For a few resume points: whether a fresh engine started there returns exactly the events
    the whole read had not returned by then, and a digest of what it returns."""
    wanted = [event_json(e) for e in events]
    out = []
    for _, resume, _open, returned in points[:: max(1, len(points) // 6)]:
        tail, _ = _follow(data, resume)
        got = [event_json(e) for e in tail]
        digest = hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()[:16]
        out.append((resume, got == wanted[returned:], digest))
    return out


def snapshot(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    events, points = _follow(data)
    return {
        "log": str(path.relative_to(CORPUS)),
        "events": [event_json(e) for e in events],
        "points": points,
        "one_by_one_same": [event_json(e) for e in _one_by_one(data)] == [event_json(e) for e in events],
        "resumed": _resumed(data, events, points),
        "report": json.loads(replay_file(path).to_json()),
    }


def main() -> None:
    with GOLDEN.open("w", encoding="utf-8") as out:
        for path in corpus_logs():
            out.write(json.dumps(snapshot(path), sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
