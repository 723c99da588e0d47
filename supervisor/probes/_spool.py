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
from typing import TYPE_CHECKING, TextIO

from ..events import Phase, ProbeKind

if TYPE_CHECKING:
    from ._replay import EventModel, ReplayReport

_MAX_TRACEBACK_LINES = 10_000  # failure lines whose first traceback is kept for the text report
_EMPTY_EVENTS = '\n  "events": []'  # how the report's JSON (indent 2) shows no event


class EventSpool:
    def __init__(self, *, keep_json: bool) -> None:
        self._file: TextIO | None = tempfile.TemporaryFile("w+", encoding="utf-8") if keep_json else None
        self.count = 0
        self.highlights: list[EventModel] = []
        self._phases: set[Phase] = set()
        self._failure_lines: set[str] = set()

    def add(self, event: EventModel) -> None:
        if self._file is not None:
            # An event is an item of the report's events list: two levels deeper than alone.
            text = event.model_dump_json(indent=2).replace("\n", "\n    ")
            self._file.write((",\n    " if self.count else "    ") + text)
        self.count += 1
        self._highlight(event)

    def _highlight(self, event: EventModel) -> None:
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
