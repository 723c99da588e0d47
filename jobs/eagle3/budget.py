"""A bounded disk for extraction and training run at once: the size parser, the ledger, the pause.

``eagle3.extract --disk-budget SIZE`` and ``eagle3.train --order stream`` on the same directory form a
pipeline: extraction writes ``hs_{i}.safetensors`` in index order and pauses while the files training has not
consumed yet would pass SIZE; training reads the samples in index order, one epoch, and releases them.

Extraction marks a pause with ``.extract-paused`` (removed on resuming); training, waiting for a sample while
that mark is there, checkpoints and releases what it has read, then names the sample it waits for.

The ledger, ``consumed.json`` in the extraction's directory, has one writer, training (rank 0):

* ``through``: samples ``0 .. through-1`` are consumed for good: a checkpoint holding every step that read
  them is on disk, so no relaunch will read them again. They are deleted after the ledger says so; a
  relaunched extraction counts them as finished and never extracts them again.
* ``waiting_for``: the sample training waits for (null when it waits for none). Extraction writes the batch
  holding it even past the budget, so a budget smaller than a training batch plus an extraction batch slows
  the pipeline but never stops it.
* ``released_bytes``: the bytes of the sample files deleted so far (a figure for the logs).

Why one epoch: a second epoch reads sample 0 again after the last one, so every file would have to stay (or
be extracted twice); a bounded disk is only possible when each sample is read once. The order is the
extraction's (index order), the only order in which a bounded disk holds what training needs next; a prompt
set shuffled once before extraction gives training its mixing. ``--order index`` trains on a complete
extraction in that same order, so an unbounded run and a budgeted one give the same weights.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import _io

LEDGER = "consumed.json"
LEDGER_FORMAT = "eagle3-consumed/1"
PAUSED = ".extract-paused"  # present while extraction waits on its budget (written by extraction only)
POLL_S = 0.05
# A wait is said at once and then every REPORT_S (``--wait-report-s``): a supervisor reads these lines as a known
# wait (probes/extract.toml and train.toml: ``paused`` heartbeats), where a silent wait reads as a stall. Well
# under supervise's default stall floor (120 s); a floor or ``silence_s`` set below it needs a shorter interval.
REPORT_S = 15.0
HEADER_BYTES = 1024  # a sample file's safetensors header and alignment, over its tensors' bytes (about 300 here)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of ``2GiB``, ``500MB``, ``1.5G`` (binary) or ``1000000``; ValueError with what to write instead."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"--disk-budget {text!r}: give a size in bytes, e.g. 2GiB, 500MB or 1000000 "
                         "(units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n < 1:
        raise ValueError(f"--disk-budget {text!r}: the budget must be at least one byte")
    return n


@dataclass(frozen=True)
class Ledger:
    """What training has consumed for good, and what it waits for (see the module's text)."""

    through: int = 0
    waiting_for: int | None = None
    released_bytes: int = 0

    @staticmethod
    def path(root: Path) -> Path:
        return root / LEDGER

    @classmethod
    def read(cls, root: Path) -> Ledger:
        try:
            d = json.loads(cls.path(root).read_text())
        except FileNotFoundError:
            return cls()
        except ValueError as e:  # written atomically: a damaged ledger is not ours to guess at
            raise RuntimeError(f"{cls.path(root)} is unreadable ({e}); it records which samples training "
                               "consumed: restore it or start the pipeline over in a new directory") from None
        if d.get("format") != LEDGER_FORMAT:
            raise RuntimeError(f"{cls.path(root)}: format {d.get('format')!r}, expected {LEDGER_FORMAT!r}")
        w = d.get("waiting_for")
        return cls(int(d["through"]), None if w is None else int(w), int(d.get("released_bytes", 0)))

    def write(self, root: Path) -> None:
        _io.atomic_write_json({"format": LEDGER_FORMAT, "through": self.through, "waiting_for": self.waiting_for,
                               "released_bytes": self.released_bytes}, self.path(root))


def release(root: Path, through: int, paths: Callable[[int], Path]) -> Ledger:
    """Record samples ``0 .. through-1`` as consumed (durably, first), then delete their files.

    A crash between the two leaves files that :func:`sweep` deletes at the next launch; never a deleted file
    the ledger does not name (which a relaunched extraction would write again)."""
    old = Ledger.read(root)
    if through <= old.through:
        return old
    sizes = {i: _size(paths(i)) for i in range(old.through, through)}
    new = Ledger(through, None, old.released_bytes + sum(sizes.values()))
    new.write(root)
    for i in sizes:
        _unlink(paths(i))
    return new


def sweep(root: Path, paths: Callable[[int], Path]) -> Ledger:
    """Delete what the ledger names as consumed and is still there (a launch killed while releasing)."""
    ledger = Ledger.read(root)
    for i in range(ledger.through):
        _unlink(paths(i))
    return ledger


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def want(root: Path, sample: int | None) -> None:
    """Tell extraction which sample training waits for (None: none)."""
    old = Ledger.read(root)
    if old.waiting_for != sample:
        Ledger(old.through, sample, old.released_bytes).write(root)


def parse_report_s(text: str) -> float:
    """``--wait-report-s``: seconds between two lines of one wait; ValueError with what to write instead."""
    try:
        secs = float(text)
    except ValueError:
        secs = float("nan")
    if not 0.1 <= secs <= 3600:  # nan fails too
        raise ValueError(f"--wait-report-s {text!r}: give seconds between 0.1 and 3600 (default {REPORT_S:g}), "
                         "under the supervisor's stall floor and silence_s")
    return secs


class Waiting:
    """One wait, said at once and then every ``every_s`` while it lasts (see REPORT_S)."""

    def __init__(self, say: Callable[[str], None], every_s: float):
        self.say = say
        self.every_s = every_s
        self.began = time.monotonic()
        self._said_at: float | None = None

    @property
    def waited_s(self) -> float:
        return time.monotonic() - self.began

    def tick(self, line: Callable[[float], str]) -> None:
        """Say ``line(seconds waited)`` if the interval has passed since the last one (or none was said)."""
        now = time.monotonic()
        if self._said_at is None or now - self._said_at >= self.every_s:
            self._said_at = now
            self.say(line(now - self.began))


def human(n: int) -> str:
    """Bytes for a reader: 1.2 GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def paused(root: Path) -> bool:
    """Whether extraction says it waits on its budget (a stale mark after a kill costs one early checkpoint)."""
    return (root / PAUSED).exists()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class Budget:
    """Extraction's side: before each batch, wait while the unconsumed files and the batch would pass it."""

    def __init__(self, root: Path, limit: int, bytes_per_token: int, say: Callable[[str], None],
                 report_s: float = REPORT_S):
        self.root = root
        self.report_s = report_s
        self.limit = limit
        self.bytes_per_token = bytes_per_token  # the hidden states' share; the header and ids are small
        self.say = say
        self.peak = 0  # the most unconsumed bytes seen at a check
        # Sizes of the finished files not consumed yet: a file never changes once written, so each is stat'ed
        # once, and the map stays as small as the budget however many samples the set has.
        self._sizes: dict[int, int] = {}
        _unlink(root / PAUSED)  # a mark left by a launch killed while paused

    def unconsumed(self, done: Iterable[int], paths: Callable[[int], Path]) -> tuple[int, Ledger]:
        ledger = Ledger.read(self.root)
        for i in done:
            if i >= ledger.through and i not in self._sizes:
                self._sizes[i] = _size(paths(i))
        for i in [k for k in self._sizes if k < ledger.through]:
            del self._sizes[i]
        n = sum(self._sizes.values())
        self.peak = max(self.peak, n)
        return n, ledger

    def wait_for_room(self, batch: Sequence[int], seq_lens: Sequence[int], done: Callable[[], Iterable[int]],
                      paths: Callable[[int], Path]) -> None:
        """Return once ``batch`` may be written: room under the budget, nothing unconsumed, or training waits
        for one of its samples."""
        need = sum(seq_lens) * self.bytes_per_token + len(batch) * HEADER_BYTES
        wait: Waiting | None = None
        while True:
            used, ledger = self.unconsumed(done(), paths)
            if used == 0 or used + need <= self.limit or (ledger.waiting_for is not None
                                                           and ledger.waiting_for in batch):
                break
            if wait is None:
                wait = Waiting(self.say, self.report_s)
                _io.atomic_write_bytes(f"{os.getpid()} {batch[0]}\n".encode(), self.root / PAUSED)
            # Said again while it lasts: the supervisor takes a silent wait for a stall (REPORT_S).
            wait.tick(lambda secs, used=used: (
                f"extract paused: {used} bytes not consumed yet, the next batch needs about {need}, budget "
                f"{self.limit} ({human(used)} unconsumed, {human(self.limit)} budget); waiting {secs:.0f}s for "
                "training to release samples"))
            time.sleep(POLL_S)
        if wait is not None:
            _unlink(self.root / PAUSED)
            self.say(f"extract resumed after {wait.waited_s:.1f}s: training consumed through "
                     f"sample {ledger.through}")
