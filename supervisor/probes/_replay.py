"""Offline replay: what a finished log shows (``supervise probe LOGFILE``).

The log is read exactly as the live follower reads it (``records.split_records``, in
chunks) and fed through a ``ProbeEngine``.  From the events:

- ``last_phase``: the highest canonical phase any event implies (by phase order).
- ``failure``: the root cause (``_rootcause.root_cause``: the first error line of the
  earliest failing process, consequences set aside).  Failures logged at DEBUG, INFO or
  WARNING level are handled errors when the log later reaches ``engine_ready`` or beyond
  (vLLM logs a WARNING traceback during a healthy start), so those are left out first.
- ``outcome``: ``oom`` if that failure is a CUDA OOM, else ``crashed`` if there is one;
  ``done`` if the ``done`` phase was reached; ``ready`` if the engine became ready (an
  ``engine_ready`` event, or lines of a server answering requests); else ``incomplete``.
- ``progress``: the last state of every bar (``_identity.Bar``: probe, description,
  process), in order of first appearance; a bar that starts over (its count goes back)
  is a new bar (a speculative draft model's shards after the target model's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel

from ..errors import ProbePackError, SuperviseError
from ..events import (
    PHASE_ORDER,
    Failure,
    FailureKind,
    Outcome,
    Phase,
    ProbeEvent,
    ProbeKind,
)
from ..records import split_records
from ._engine import ProbeEngine
from ._identity import BarBook
from ._pack import load_packs, search_dirs
from ._rootcause import root_cause

_CHUNK = 4 << 20
_TRACEBACK_TAIL = 15
_CRASHED = frozenset({Outcome.CRASHED, Outcome.OOM})
_EX_NOINPUT = 66  # sysexits: an input file did not exist or was not readable


class FailureSummary(BaseModel):
    kind: FailureKind
    line: str
    fingerprint: str | None


class ProgressSummary(BaseModel):
    probe: str
    bar: str  # the bar's description, else the probe, with the process drawing it
    process: str  # "" when the lines carry no process prefix
    done: int | float | None
    total: int | float | None


class EventModel(BaseModel):
    kind: ProbeKind
    probe: str
    offset: int
    line: str
    phase: Phase | None = None
    failure: FailureKind | None = None
    fields: dict[str, Any] = {}
    traceback: str | None = None
    fingerprint: str | None = None

    @classmethod
    def of(cls, event: ProbeEvent) -> EventModel:
        # The documented JSON is flat: a failure's kind, traceback and fingerprint beside the
        # event's fields, its log level among them.
        failure = event.failure
        fields = event.fields
        if failure is not None and failure.level is not None:
            fields = {**fields, "level": failure.level}
        return cls(
            kind=event.kind,
            probe=event.probe,
            offset=event.offset,
            line=event.line,
            phase=event.phase,
            failure=None if failure is None else failure.kind,
            fields=fields,
            traceback=None if failure is None else failure.traceback,
            fingerprint=None if failure is None else failure.fingerprint,
        )


class ReplayReport(BaseModel):
    outcome: Outcome
    last_phase: Phase | None
    failure: FailureSummary | None
    progress: list[ProgressSummary]
    events: list[EventModel]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def render_text(self) -> str:
        """The report for humans: outcome, phase timeline, progress, failure."""
        lines = [f"outcome: {self.outcome.value}    last phase: {self.last_phase.value if self.last_phase else '-'}"]
        lines += self._timeline()
        if self.progress:
            lines.append("progress:")
            width = max(len(p.bar) for p in self.progress)
            lines += [f"  {p.bar:<{width}}  {_num(p.done)}/{_num(p.total)}" for p in self.progress]
        lines += self._failure_text()
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.kind.value] = counts.get(event.kind.value, 0) + 1
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        lines.append(f"events: {len(self.events)}" + (f" ({summary})" if summary else ""))
        return "\n".join(lines)

    def _timeline(self) -> list[str]:
        first: dict[Phase, EventModel] = {}
        for event in self.events:
            if event.phase is not None and event.phase not in first:
                first[event.phase] = event
        if not first:
            return ["phases: none seen"]
        out = ["phases:"]
        for phase in PHASE_ORDER:
            if phase in first:
                event = first[phase]
                out.append(f"  {phase.value:<18} @{event.offset:<10} {_clip(event.line)}")
        return out

    def _failure_text(self) -> list[str]:
        if self.failure is None:
            return ["failure: none"]
        out = [f"failure: {self.failure.kind.value}  (fingerprint {self.failure.fingerprint or '-'})",
               f"  {_clip(self.failure.line, 200)}"]
        source = next((e for e in self.events if e.kind is ProbeKind.FAILURE and e.line == self.failure.line
                       and e.traceback), None)
        if source is not None and source.traceback:
            tail = source.traceback.splitlines()[-_TRACEBACK_TAIL:]
            out.append(f"  traceback (last {len(tail)} lines):")
            out += [f"    {_clip(line, 200)}" for line in tail]
        return out


# ---- replaying ------------------------------------------------------------------------


def replay_file(
    path: str | os.PathLike[str],
    pack_names: Sequence[str] | None = None,
    pack_paths: Sequence[str | os.PathLike[str]] = (),
) -> ReplayReport:
    """Replay a log file through the probe packs (``pack_names=None``: all built-in packs)."""
    packs = load_packs(pack_names, pack_paths)
    if not packs:  # nothing could match: "no failure" would be a lie
        searched = ", ".join(str(d) for d in search_dirs())
        raise ProbePackError(f"no probe pack found (searched {searched}); reinstall supervise or pass --pack-file")
    engine = ProbeEngine(packs)
    events: list[ProbeEvent] = []
    offset = 0
    pending = b""
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            data = pending + chunk
            records, used = split_records(data, offset, final=not chunk)
            events += engine.feed_many(records)
            pending = data[used:]
            offset += used
            if not chunk:
                break
    events += engine.flush()
    return build_report(events)


def build_report(events: Iterable[ProbeEvent]) -> ReplayReport:
    """The report for a finished log's events (in offset order)."""
    events = list(events)
    last_phase = _last_phase(events)
    failure = choose_failure(events)
    return ReplayReport(
        outcome=_outcome(events, last_phase, failure),
        last_phase=last_phase,
        failure=None if failure is None else FailureSummary(
            kind=failure.kind, line=failure.line, fingerprint=failure.fingerprint
        ),
        progress=_progress(events),
        events=[EventModel.of(e) for e in events],
    )


def _last_phase(events: list[ProbeEvent]) -> Phase | None:
    phases = [e.phase for e in events if e.phase is not None]
    return max(phases, key=lambda p: p.rank) if phases else None


def choose_failure(events: list[ProbeEvent]) -> Failure | None:
    """The failure that explains the log (see the module docstring for the rule)."""
    ready_at = _latest_offset_from(events, Phase.ENGINE_READY)
    return root_cause([e.failure for e in events
                       if e.failure is not None and not _handled(e.failure, e.offset, ready_at)])


def _handled(failure: Failure, offset: int, ready_at: int | None) -> bool:
    """A failure logged below ERROR that the log got past (ready or serving afterwards)."""
    return failure.survivable and ready_at is not None and ready_at > offset


def _latest_offset_from(events: list[ProbeEvent], phase: Phase) -> int | None:
    """The offset of the last event implying ``phase`` or a later one."""
    offsets = [e.offset for e in events if e.phase is not None and e.phase.rank >= phase.rank]
    return max(offsets) if offsets else None


def _outcome(events: list[ProbeEvent], last_phase: Phase | None, failure: Failure | None) -> Outcome:
    if failure is not None:
        return Outcome.OOM if failure.kind is FailureKind.CUDA_OOM else Outcome.CRASHED
    if last_phase is Phase.DONE:
        return Outcome.DONE
    if any(e.phase is Phase.ENGINE_READY or e.fields.get("serving") is True for e in events):
        return Outcome.READY
    return Outcome.INCOMPLETE


def _progress(events: list[ProbeEvent]) -> list[ProgressSummary]:
    book = BarBook()
    bars: dict[int, ProgressSummary] = {}  # by bar id: in order of first appearance
    for event in events:
        done = event.fields.get("done")
        if event.kind is not ProbeKind.PROGRESS or not isinstance(done, (int, float)):
            continue
        total = event.fields.get("total")
        run, _ = book.place(event.probe, event.fields, done, total if isinstance(total, (int, float)) else None)
        bars[run.id] = ProgressSummary(probe=event.probe, bar=run.bar.label, process=run.bar.process,
                                       done=run.done, total=run.total)
    return list(bars.values())


# ---- the CLI command ------------------------------------------------------------------


def probe_command(path: str, packs: list[str], pack_paths: list[str], as_json: bool) -> int:
    """``supervise probe``: print what a log shows.

    Exit status, as grep signals a match: 1 when the log shows a crash (outcome ``crashed``
    or ``oom``), 0 for any other outcome.  Errors are one line on stderr: 65 when no pack
    loads (a broken pack, an unknown name, none found at all), 66 when the log cannot be read.
    """
    try:
        report = replay_file(path, packs or None, pack_paths)
    except SuperviseError as exc:
        print(f"supervise probe: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"supervise probe: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return _EX_NOINPUT
    print(report.to_json() if as_json else report.render_text())
    return 1 if report.outcome in _CRASHED else 0


def _num(value: int | float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _clip(text: str, width: int = 120) -> str:
    text = text.replace("\t", " ")
    return text if len(text) <= width else text[: width - 1] + "…"
