"""The log's last lines kept as evidence (supervisor/watchdog/_tail.py): a batch read from its end
keeps what reading every record of it would."""

from __future__ import annotations

import random
from collections import deque

from supervisor.core.events import Record
from supervisor.probes import ANSI_RE
from supervisor.watchdog._tail import MAX_LINE_CHARS, MAX_LINES, LogTail


def _every_record(kept: deque[str], records: list[Record]) -> None:
    """The tail as it was taken before: every record of the batch, in order."""
    for record in records:
        text = record.text
        if "\x1b" in text:
            text = ANSI_RE.sub("", text)
        text = text.strip()
        if text:
            kept.append(text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 1] + "…")


def test_batches_of_any_size_leave_the_same_last_lines() -> None:
    rng = random.Random(7)
    texts = ["", "   ", "step 1", "\x1b[31merror\x1b[0m", "x" * 400, "\x1b[0m", " loss 0.1 "]
    tail, reference = LogTail(), deque[str](maxlen=MAX_LINES)
    offset = 0
    for _ in range(2000):
        batch = []
        for _ in range(rng.choice([0, 1, 2, 3, 7, 40, 256])):
            text = rng.choice(texts) + (f" {offset}" if rng.random() < 0.5 else "")
            batch.append(Record(text, offset, offset + len(text) + 1))
            offset += len(text) + 1
        tail.seen(batch)
        _every_record(reference, batch)
        assert tail.lines == list(reference)
