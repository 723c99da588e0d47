"""The part of a log written while the daemon was down, dated.

A re-adopted attempt's log is read again from the stored offset; what lies between that offset
and the log's size at adoption was written while no daemon watched.  Dated at the moment it is
read, a hundred progress lines would all share the restart's time: their intervals would read
as zero (a rate of thousands of items a second), and a stall would look like it had just moved.
Lines carry no time of their own, so each is dated by its place in the log, between the last
event the old daemon stored (its offset and time) and the log's last modification: exact for
the last line, and for the others as good as the job's output is steady.
"""

from __future__ import annotations

from dataclasses import dataclass

# How long a re-adopted attempt's reading of its backlog may go without moving before it is judged
# anyway: reading takes well under a second even for megabytes, and is waited for as long as it
# moves (under load, slowly); this bounds a log that cannot be read to its end.
CATCH_UP_STILL_S = 5.0


@dataclass(frozen=True)
class Backlog:
    """Log bytes [start_offset, end_offset) of one generation, written from start_ts to end_ts
    (wall-clock times)."""

    generation: int
    start_offset: int
    start_ts: float
    end_offset: int
    end_ts: float

    def covers(self, offset: int, generation: int) -> bool:
        """Whether the record starting at ``offset`` was written before the attempt was adopted."""
        return generation == self.generation and offset < self.end_offset

    def wall_at(self, offset: int) -> float:
        """When the record at ``offset`` was written, by its place between the two ends."""
        span = self.end_offset - self.start_offset
        share = 1.0 if span <= 0 else min(1.0, max(0.0, (offset - self.start_offset) / span))
        return self.start_ts + share * (self.end_ts - self.start_ts)


@dataclass(frozen=True)
class CatchUp:
    """What the watch of a re-adopted attempt starts from.  Its deadlines may have passed while no
    daemon watched: it is judged at once, but only once its ``backlog`` is read (or once reading
    it has not moved since ``until``, a clock time: a log that cannot be read to its end).
    ``exited``: its command had ended by then (its exit status written): it is judged by that
    exit, once its log is read, never by a clock that ran while nobody could watch it."""

    backlog: Backlog | None
    until: float | None
    exited: bool = False


def backlog_of(generation: int, resume_offset: int, anchor: tuple[int, float], size: int, mtime: float,
               now: float) -> Backlog | None:
    """The backlog of a log of ``size`` bytes last modified at ``mtime``, read again from
    ``resume_offset``; ``anchor``: the (offset, wall time) of the latest record known to have been
    read before (the last stored event, else the start of the log and the attempt's start).
    None when nothing was written unread, or the times disagree (a clock set back)."""
    start_offset, start_ts = anchor
    if size <= resume_offset or start_offset > resume_offset or not start_ts <= mtime <= now:
        return None
    return Backlog(generation, start_offset, start_ts, size, mtime)
