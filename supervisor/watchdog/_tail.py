"""The log's last non-empty lines: the evidence of an attempt whose failure no probe recognised.

A program that dies with a one-line cause no pack knows (``python3: can't open file
'nonexistent.py'``, a C++ program's own error message, a shell's complaint) would otherwise be
judged "crashed, no error line recognised" with nothing to look at, while the cause sits at the
log's end.  These lines go into the verdict's reason and evidence, hence ``status``, the alert and
the web page.

Bounded whatever the log: a few lines, each cut short, and only their text is kept (ANSI codes
taken out, a progress bar's ``\\r`` redraws read as the line they leave on the screen).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from supervisor.core.events import Record
from supervisor.probes import ANSI_RE

MAX_LINES = 5
MAX_LINE_CHARS = 300


class LogTail:
    """The last ``MAX_LINES`` non-empty lines of the records seen, in log order."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=MAX_LINES)

    def seen(self, records: Sequence[Record]) -> None:
        # Only the batch's last non-empty lines can stay: read from its end, and stop once there are enough
        # (a daemon behind its logs takes them 256 records a step).
        last: list[str] = []
        for record in reversed(records):
            text = record.text
            if "\x1b" in text:
                text = ANSI_RE.sub("", text)
            text = text.strip()
            if text:
                last.append(text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 1] + "…")
                if len(last) == MAX_LINES:
                    break
        self._lines.extend(reversed(last))

    @property
    def lines(self) -> list[str]:
        return list(self._lines)
