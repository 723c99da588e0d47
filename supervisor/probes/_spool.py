"""The listed events of an offline report, kept on disk while the log is read.

``supervise probe --json`` lists up to ``_replay._MAX_EVENTS`` events, and the report's
JSON puts them after the outcome, failure and progress, which are known only at the end:
held as objects, a busy log's events cost hundreds of MB (measured: 213 MiB of peak RSS on a
20 MB corpus log).  The spool writes each event's JSON to a temporary file as it comes and
keeps in memory only what the text report reads (``highlights``: the first event of each
phase, and the first event with a traceback of each failure line).  ``write_json`` prints
the report exactly as ``ReplayReport.to_json`` would, byte for byte.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Generic, Protocol, TextIO, TypeVar

from supervisor.core.events import Phase, ProbeKind


class EventModel(Protocol):
    """What the spool reads of a listed event (``_replay.EventModel``)."""

    kind: ProbeKind
    phase: Phase | None
    line: str
    traceback: str | None

    def to_json(self, level: int = 0) -> str:
        """Its JSON object as the report lists it, its keys one level below ``level``."""
        ...


Listed = TypeVar("Listed", bound=EventModel)


class ReplayReport(Protocol):
    """The report without its events (``_replay.ReplayReport``)."""

    def to_json(self) -> str: ...

_BATCH = 1024  # events dumped to the file at a time
_MAX_TRACEBACK_LINES = 10_000  # failure lines whose first traceback is kept for the text report
_EMPTY_EVENTS = '\n  "events": []'  # how the report's JSON (indent 2) shows no event
_ITEM = "    "  # a listed event's indent in the report: inside the report's object, inside "events"


class EventSpool(Generic[Listed]):
    def __init__(self, *, keep_json: bool) -> None:
        self._file: TextIO | None = None
        if keep_json:  # closed by close(), after the report is printed
            self._file = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        self.count = 0
        self.highlights: list[Listed] = []
        self._phases: set[Phase] = set()
        self._failure_lines: set[str] = set()
        self._pending: list[Listed] = []
        self._written = 0

    def add(self, event: Listed) -> None:
        if self._file is not None:
            self._pending.append(event)
            if len(self._pending) >= _BATCH:
                self._write_pending()
        self.count += 1
        self._highlight(event)

    def _write_pending(self) -> None:
        """Events are dumped a batch at a time (one call per event cost 10% more CPU)."""
        if self._file is None or not self._pending:
            return
        dumped = ",\n".join(_ITEM + event.to_json(2) for event in self._pending)
        self._file.write((",\n" if self._written else "") + dumped)
        self._written += len(self._pending)
        self._pending.clear()

    def _highlight(self, event: Listed) -> None:
        if event.phase is not None and event.phase not in self._phases:
            self._phases.add(event.phase)
            self.highlights.append(event)
        elif (event.kind is ProbeKind.FAILURE and event.traceback and event.line not in self._failure_lines
              and len(self._failure_lines) < _MAX_TRACEBACK_LINES):
            self._failure_lines.add(event.line)
            self.highlights.append(event)

    def write_json(self, report: ReplayReport, out: TextIO) -> None:
        """The report (whose own events list is empty) with the spooled events, as ``to_json``."""
        head = report.to_json()
        self._write_pending()
        if not self.count or self._file is None:
            out.write(head + "\n")
            return
        at = head.index(_EMPTY_EVENTS)  # a key: inside a string its quotes would be escaped
        out.write(head[:at] + '\n  "events": [\n')
        self._file.seek(0)
        shutil.copyfileobj(self._file, out)
        out.write("\n  ]" + head[at + len(_EMPTY_EVENTS):] + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
