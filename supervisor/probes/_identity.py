"""Who wrote a line, and which bar it draws: identities read from an event's fields.

A line's *process* is what its stripped prefixes say about the writer: vLLM's
``(Worker_TP1 pid=79)``, torchrun's ``[rank1]:``, SGLang's ``[... TP3]``, docker
compose's service, journald's host and pid.  Lines with no such prefix share the
process ``""`` (one program writing to one log).  torchrun's ``--tee`` prefix
(``[default0]:``) names a worker too.

A *bar* is one progress bar: the probe that reads it, the bar's own description when the
probe captures one (``desc``: a dataset's ``Generating train split`` is not the
``Loading weights`` bar the same generic tqdm probe reads) and the process that draws it
(TP ranks each draw their own).  The replay, the watchdog (one stall track per bar) and
``status`` all keep bars apart by this identity.

``BarBook`` tells which bar a progress line draws.  Only a bar's first line may carry the
process prefix (vLLM prefixes the line a ``\r`` redraw starts on, not the redraws), so a
line with no process continues a bar of any process, and a bar first seen without one
takes the process of a later line.  A line continues the most recent such bar whose count
it does not take back and whose total it keeps; otherwise it starts a new bar (a
speculative draft model's 0/48 after the target model's 48/48, an evaluation bar between
two steps of a training bar).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Prefix fields that name the writing process (the packs' prefix regexes use these names).
PROCESS_FIELDS = ("service", "host", "tee", "proc", "rank", "pid")


def process_of(fields: Mapping[str, Any]) -> str:
    """``"Worker_TP1 pid=79"``, ``"rank=1"``, ``""`` for a line with no process prefix."""
    parts = []
    for name in PROCESS_FIELDS:
        value = fields.get(name)
        if value is None or value == "":
            continue
        parts.append(str(value) if name == "proc" else f"{name}={value}")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Bar:
    """One progress bar's identity."""

    probe: str
    desc: str  # the bar's own description ("" when the probe captures none)
    process: str  # see ``process_of``

    @property
    def key(self) -> str:
        """A stable one-string id (the watchdog's track key, the stored progress's ``bar``)."""
        return " | ".join(part for part in (self.probe, self.desc, self.process) if part)

    @property
    def label(self) -> str:
        """What a person reads: the bar's description, else the probe, with its process."""
        name = self.desc or self.probe
        return f"{name} ({self.process})" if self.process else name


def bar_of(probe: str, fields: Mapping[str, Any]) -> Bar:
    get = fields.get
    desc = get("desc")
    # PROCESS_FIELDS, spelt out: asked for every progress line, and a list made per line cost a third of it.
    key = (probe, desc, get("service"), get("host"), get("tee"), get("proc"), get("rank"), get("pid"))
    try:
        return _BARS[key]
    except KeyError:
        pass
    except TypeError:  # a field that is not hashable: nothing to keep
        return _bar(probe, desc, fields)
    if len(_BARS) >= _BARS_KEPT:
        _BARS.clear()
    bar = _BARS[key] = _bar(probe, desc, fields)
    return bar


def _bar(probe: str, desc: Any, fields: Mapping[str, Any]) -> Bar:
    return Bar(probe, " ".join(str(desc).split()) if desc else "", process_of(fields))


# Each redraw of a bar asks for its identity two or three times (the watchdog, the stored
# milestones, the replay); a busy log redraws the same few bars thousands of times a second.
# The identities last seen are kept by the fields they are made of (bounded: a log whose every
# line names another process would otherwise grow it).
_BARS_KEPT = 4096
_BARS: dict[tuple[Any, ...], Bar] = {}


@dataclass
class BarRun:
    """One bar as drawn so far; ``id`` numbers bars in order of first appearance."""

    id: int
    bar: Bar
    done: float
    total: float | None


@dataclass
class BarBook:
    """Which bar each progress line draws (module docstring); keeps the latest bars only."""

    window: int = 64  # bars a line may continue: enough for every rank's bars, bounded
    recent: deque[BarRun] = field(default_factory=deque)
    next_id: int = 0

    def place(self, probe: str, fields: Mapping[str, Any], done: float, total: float | None,
              seen: Bar | None = None) -> tuple[BarRun, bool]:
        """The bar this line draws, updated, and whether the line started it (``seen``: the
        line's ``bar_of``, when the caller has it already)."""
        seen = seen or bar_of(probe, fields)
        for run in reversed(self.recent):
            bar = run.bar
            if bar.probe != probe or bar.desc != seen.desc or not _same_process(bar.process, seen.process):
                continue
            if done < run.done or (total is not None and run.total is not None and total != run.total):
                continue
            if not bar.process and seen.process:
                run.bar = seen
            run.done, run.total = done, total if total is not None else run.total
            return run, False
        run = BarRun(self.next_id, seen, done, total)
        self.next_id += 1
        self.recent.append(run)
        if len(self.recent) > self.window:
            self.recent.popleft()
        return run, True

    def earlier_runs(self, run: BarRun) -> list[int]:
        """Ids of the recent bars ``run`` may be a new run of (same probe, description and
        process): drawn again from the start, the bar's earlier run is over."""
        bar = run.bar
        return [r.id for r in self.recent if r.id < run.id and r.bar.probe == bar.probe and r.bar.desc == bar.desc
                and _same_process(r.bar.process, bar.process)]


def _same_process(a: str, b: str) -> bool:
    return a == b or not a or not b
