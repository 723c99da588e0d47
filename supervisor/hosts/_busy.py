"""Adaptive batching for log readers: the cost of following is per read, not per byte.

A log written faster than ``busy_lines_per_s`` is read at most every ``interval`` (many lines per
wake-up); a quieter one is read the moment it is written.  The rate is measured over windows of
at least ``_RATE_WINDOW_S``: two lines landing in one read are jitter, not a busy log, and must
not delay the next line.
"""

from __future__ import annotations

import time

_RATE_WINDOW_S = 0.1
# Busy above this many lines a second; then read at most this often.  The SSH agent, a program
# of its own on the remote box (hosts.ssh._agent_program), repeats the same two numbers.
BUSY_LINES_PER_S = 500.0
BUSY_READ_INTERVAL_S = 0.02


class BusyPacer:
    """How long a reader should let a busy log gather before its next read."""

    def __init__(self, busy_lines_per_s: float, interval: float) -> None:
        self.busy_lines_per_s = busy_lines_per_s
        self.interval = interval
        self._last_read_at = 0.0
        self._lines_per_s = 0.0
        self._window_start = 0.0
        self._window_records = 0

    def read(self, records: int) -> None:
        """A read brought ``records`` records."""
        now = time.monotonic()
        self._last_read_at = now
        self._window_records += records
        elapsed = now - self._window_start
        if elapsed >= _RATE_WINDOW_S:
            self._lines_per_s = self._window_records / elapsed
            self._window_start, self._window_records = now, 0
        elif elapsed < 0 or self._window_start == 0.0:
            self._window_start = now

    def delay(self) -> float:
        """Seconds to wait before the next read (<= 0: read now)."""
        if self._lines_per_s < self.busy_lines_per_s:
            return 0.0
        return self.interval - (time.monotonic() - self._last_read_at)
