"""Offline replay: what a finished log shows (``supervise probe LOGFILE``).

The log is read exactly as the live follower reads it (``records.split_records``, in
chunks) and fed through a ``ProbeEngine``.  From the events:

- ``last_phase``: the phase the events imply, by the rule the live watchdog uses
  (``_phasefold.entered_phase``): the highest any event implies, but no ``done`` straight after a
  failure.
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

Memory stays bounded whatever the log (a day of tqdm redraws is millions of records): the
file is streamed, a run of redraws of one bar is read as its first and its last redraw (those
between are not even split into records: ``_barfold.middle_redraws``), lines no probe can read
are skipped unsplit (``_quiet``), a run of progress events of one probe is listed as its first
and last, the summary is kept as it goes (never from a list of every event), and at most
``_MAX_EVENTS`` events are listed (``events_omitted`` then says how many more there were).
``supervise probe`` keeps even those listed events on disk until it prints them (``_spool``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.errors import ProbePackError, SuperviseError
from supervisor.core.events import (
    PHASE_ORDER,
    Failure,
    FailureKind,
    Outcome,
    Phase,
    ProbeEvent,
    ProbeKind,
)
from supervisor.core.progress import Progress, count
from supervisor.core.records import split_records
from supervisor.probes._barfold import RedrawCoalescer, middle_redraws
from supervisor.probes._engine import ProbeEngine
from supervisor.probes._identity import Bar, BarBook, BarRun, bar_of
from supervisor.probes._loading import load_packs, search_dirs
from supervisor.probes._phasefold import (
    ends_attempt,
    entered_phase,
    entering_recovers,
    goes_on_serving,
    implied_phase,
    starts_new_attempt,
    survived,
)
from supervisor.probes._quiet import ChunkPlan
from supervisor.probes._reportjson import INDENT as _INDENT
from supervisor.probes._reportjson import dumps, mapping, string
from supervisor.probes._rootcause import echoes_only, root_cause
from supervisor.probes._spool import EventSpool

_CHUNK = 4 << 20
_MAX_EVENTS = 100_000  # listed in a report; the summary counts every event
_MAX_CANDIDATES = 1_000  # failures kept for the root-cause choice, of each kind (fatal, survivable)
_TRACEBACK_TAIL = 15
_CRASHED = frozenset({Outcome.CRASHED, Outcome.OOM})
_EX_NOINPUT = 66  # sysexits: an input file did not exist or was not readable


# The report's values are plain dataclasses, written as JSON by ``_reportjson`` (byte for byte what
# the pydantic models they were wrote): ``supervise probe`` imports no pydantic.


@dataclass(frozen=True, slots=True)
class FailureSummary:
    kind: FailureKind
    line: str
    fingerprint: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "line": self.line, "fingerprint": self.fingerprint}


@dataclass(frozen=True, slots=True)
class ProgressSummary:
    probe: str
    bar: str  # the bar's description, else the probe, with the process drawing it
    process: str  # "" when the lines carry no process prefix
    done: int | float | None
    total: int | float | None

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "bar": self.bar, "process": self.process, "done": self.done, "total": self.total}


@dataclass(slots=True)
class EventModel:
    kind: ProbeKind
    probe: str
    offset: int
    line: str
    phase: Phase | None = None
    failure: FailureKind | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    fingerprint: str | None = None

    @classmethod
    def of(cls, event: ProbeEvent) -> EventModel:
        # The documented JSON is flat: a failure's kind, traceback and fingerprint beside the
        # event's fields, its log level among them.
        failure = event.failure
        fields = event.fields
        if failure is None:
            return cls(event.kind, event.probe, event.offset, event.line, event.phase, None, fields)
        if failure.level is not None:
            fields = {**fields, "level": failure.level}
        return cls(event.kind, event.probe, event.offset, event.line, event.phase, failure.kind, fields,
                   failure.traceback, failure.fingerprint)

    def to_json(self, level: int = 0) -> str:
        """The event's JSON object, its keys indented one level below ``level`` (one listed event
        is written per call: a template, not ``_reportjson.dumps``'s walk, for the busy logs)."""
        i = _INDENT * (level + 1)
        return (f'{{\n{i}"kind": {string(self.kind)},\n{i}"probe": {string(self.probe)},\n'
                f'{i}"offset": {int.__repr__(self.offset)},\n{i}"line": {string(self.line)},\n'
                f'{i}"phase": {string(self.phase)},\n{i}"failure": {string(self.failure)},\n'
                f'{i}"fields": {mapping(self.fields, level + 1)},\n{i}"traceback": {string(self.traceback)},\n'
                f'{i}"fingerprint": {string(self.fingerprint)}\n{_INDENT * level}}}')


@dataclass
class ReplayReport:
    outcome: Outcome
    last_phase: Phase | None
    failure: FailureSummary | None
    progress: list[ProgressSummary]
    events: list[EventModel]
    events_omitted: int = 0  # events beyond _MAX_EVENTS, counted but not listed
    recovered: FailureSummary | None = None  # a failure the program went on from: not the outcome
    counts: dict[str, int] = field(default_factory=dict)  # every event, by kind (not in the JSON)
    # What the text report reads when the events went to a spool instead (see _spool); not in the JSON.
    highlights: list[EventModel] = field(default_factory=list)

    def to_json(self) -> str:
        # The documented shape; events_omitted (the list was cut) and recovered only when they say something.
        return self._json(complete=False)

    def model_dump_json(self) -> str:
        """Every field of the report (events_omitted and recovered always) on one line: what this method
        gave when the report was a pydantic model, kept for scripts that read a report in-process (the
        same values; a float's digits as Python writes them)."""
        return json.dumps(json.loads(self._json(complete=True)), ensure_ascii=False, separators=(",", ":"))

    def _json(self, *, complete: bool) -> str:
        i = _INDENT
        parts = [f'{i}"outcome": {string(self.outcome)}', f'{i}"last_phase": {string(self.last_phase)}',
                 f'{i}"failure": {dumps(self.failure.to_dict() if self.failure else None, 1)}',
                 f'{i}"progress": {dumps([p.to_dict() for p in self.progress], 1)}',
                 f'{i}"events": ' + ("[\n" + ",\n".join(i * 2 + e.to_json(2) for e in self.events) + f"\n{i}]"
                                     if self.events else "[]")]
        if self.events_omitted or complete:
            parts.append(f'{i}"events_omitted": {int.__repr__(self.events_omitted)}')
        if self.recovered is not None or complete:
            parts.append(f'{i}"recovered": {dumps(self.recovered.to_dict() if self.recovered else None, 1)}')
        return "{\n" + ",\n".join(parts) + "\n}"

    def render_text(self) -> str:
        """The report for humans: outcome, phase timeline, progress, failure."""
        lines = [f"outcome: {self.outcome.value}    last phase: {self.last_phase.value if self.last_phase else '-'}"]
        lines += self._timeline()
        if self.progress:
            lines.append("progress:")
            width = max(len(p.bar) for p in self.progress)
            lines += [f"  {p.bar:<{width}}  {_num(p.done)}/{_num(p.total)}" for p in self.progress]
        lines += self._failure_text()
        counts = self.counts or _counts(self.events)
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        lines.append(f"events: {sum(counts.values())}" + (f" ({summary})" if summary else ""))
        return "\n".join(lines)

    def _timeline(self) -> list[str]:
        first: dict[Phase, EventModel] = {}
        for event in self.events or self.highlights:
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
        if self.failure is None and self.recovered is not None:
            # The word `status` uses for a done attempt's failure: the same thing, said the same way.
            return [f"recovered: {self.recovered.kind.value}  (fingerprint {self.recovered.fingerprint or '-'})",
                    f"  {_clip(self.recovered.line, 200)}"]
        if self.failure is None:
            return ["failure: none"]
        out = [f"failure: {self.failure.kind.value}  (fingerprint {self.failure.fingerprint or '-'})",
               f"  {_clip(self.failure.line, 200)}"]
        source = next((e for e in self.events or self.highlights if e.kind is ProbeKind.FAILURE and e.line == self.failure.line
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
    spool: EventSpool[EventModel] | None = None,
    *,
    skip_quiet: bool = True,
) -> ReplayReport:
    """Replay a log file through the probe packs (``pack_names=None``: all built-in packs).
    With a ``spool`` the listed events go there, not into the report's ``events``.
    ``skip_quiet=False``: every line is split and fed (what skipping must agree with; tests)."""
    packs = load_packs(pack_names, pack_paths)
    if not packs:  # nothing could match: "no failure" would be a lie
        searched = ", ".join(str(d) for d in search_dirs())
        raise ProbePackError(f"no probe pack found (searched {searched}); reinstall supervise or pass --pack-file")
    engine = ProbeEngine(packs, fold_runs=True)
    summary = _Summary(spool)
    bars = RedrawCoalescer()

    def feed(data: bytes, offset: int, final: bool, plan: ChunkPlan | None = None) -> int:
        start = 0
        for skip_from, skip_to in middle_redraws(data):  # what the coalescer would drop, unsplit
            records, _ = split_records(data[start:skip_from], offset + start, True)
            summary.add(engine.feed_many(bars.feed(records), plan), engine.folded)
            start = skip_to
        records, used = split_records(data[start:] if start else data, offset + start, final)
        summary.add(engine.feed_many(bars.feed(records), plan), engine.folded)
        return start + used

    offset = 0
    pending = b""
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            data = pending + chunk
            final = not chunk
            plan = engine.plan_chunk(data, offset, final) if skip_quiet else None
            if plan is None:
                used = feed(data, offset, final)
            else:
                # Only the stretches the prefilter names are split and read (``_quiet``), and
                # the lines between them too while a traceback is open; the chunk's scan says
                # which of their records to read.
                done = 0
                for start, end in plan.spans:
                    if engine.has_open_traceback:
                        start = done
                    feed(data[start:end], offset + start, True, plan)
                    done = end
                used = plan.stop
            pending = data[used:]
            offset += used
            if final:
                break
    summary.add(engine.feed_many(bars.flush()), engine.folded)
    summary.add(engine.flush(), engine.folded)
    return summary.report()


def build_report(events: Iterable[ProbeEvent]) -> ReplayReport:
    """The report for a finished log's events (in offset order)."""
    summary = _Summary()
    summary.add(events)
    return summary.report()


class _Summary:
    """The report, kept as events come: bounded whatever their number."""

    def __init__(self, spool: EventSpool[EventModel] | None = None) -> None:
        self.events: list[EventModel] = []
        self._spool = spool
        self._listed = 0
        self._last: EventModel | None = None  # the last event listed
        self.omitted = 0
        self.counts: dict[str, int] = {}
        self.last_phase: Phase | None = None
        self.ready = False
        self._bars = BarBook()
        # By bar id, in order of first appearance; summarised once, at the end (a bar's run only
        # changes when a line of it is placed, so its final state is its summary).
        self.progress: dict[int, BarRun] = {}
        self.failures = _FailureCandidates()
        self._run_end: ProbeEvent | None = None  # the latest of a run of one probe's progress, unlisted
        # No failure since the last advance (``entered_phase``), and each bar's count as last seen.
        self._recovered = True
        self._fatal_seen = False  # a ``fatal = true`` failure: never recovered from
        self._attempt_over = False  # a launcher said the workers' attempt failed (``attempt_over``)
        self._done_seen: dict[int, float] = {}

    def add(self, events: Iterable[ProbeEvent], folded: dict[int, list[float]] | None = None) -> None:
        """Take the next events; ``folded``: the counts of bar lines the engine folded before
        the event at each offset (``_barfold``), each counted and placed as its event would be."""
        for event in events:
            counts = folded.pop(event.offset, None) if folded and event.kind is ProbeKind.PROGRESS else None
            if counts:
                seen = bar_of(event.probe, event.fields)
                total = count(event.fields.get("total"))
                for done in counts:
                    was_recovered = self._recovered
                    self.counts["progress"] = self.counts.get("progress", 0) + 1
                    self._place(event.probe, event.fields, done, total, seen)
                    if self._recovered and not was_recovered and not self._fatal_seen:
                        self.failures.recovered()
            was_recovered = self._recovered
            self._add(event)
            if self._recovered and not was_recovered and not self._fatal_seen:
                self.failures.recovered()  # those before went on: a later failure explains the log

    def _add(self, event: ProbeEvent) -> None:
        self.counts[event.kind.value] = self.counts.get(event.kind.value, 0) + 1
        implied = implied_phase(event.kind, event.phase, self.last_phase)
        entered = entered_phase(self.last_phase, implied, recovered=self._recovered)
        if entered is not None:
            self.last_phase = entered
            self._recovered = self._recovered or entering_recovers(event.kind, event.fields)
        if not self._recovered and goes_on_serving(event.fields):
            self._recovered = True
        if event.phase is not None and event.phase.rank >= Phase.ENGINE_READY.rank:
            self.failures.ready_at(event.offset)
        self.ready = self.ready or event.phase is Phase.ENGINE_READY or event.fields.get("serving") is True
        if event.kind is ProbeKind.PROGRESS:
            self._progress(event)
        if event.failure is not None:
            if starts_new_attempt(self._attempt_over, event.failure):
                self.failures.recovered()  # the earlier attempt's failures explain only that attempt
            self._attempt_over = ends_attempt(self._attempt_over, event.failure, event.fields)
            # One the program survives (a ready server's failed request) is no candidate.
            if not survived(event.failure.survivable, self.last_phase):
                self.failures.add(event.failure, event.offset)
                self._recovered = False
            self._fatal_seen = self._fatal_seen or event.failure.fatal
        self._list(event)

    def _progress(self, event: ProbeEvent) -> None:
        progress = Progress.read(event.fields)  # the count the watchdog and the store read
        if progress is not None:
            self._place(event.probe, event.fields, progress.done, progress.total)

    def _place(self, probe: str, fields: dict[str, Any], done: float, total: float | None, seen: Bar | None = None) -> None:
        run, new = self._bars.place(probe, fields, done, total, seen)
        if not new and self._done_seen.get(run.id) != run.done:
            self._recovered = True  # a step forward of a bar already drawn: an advance, as the watchdog counts it
        self._done_seen[run.id] = run.done
        self.progress[run.id] = run

    def _list(self, event: ProbeEvent) -> None:
        last = self._last
        if (event.kind is ProbeKind.PROGRESS and last is not None and last.kind is ProbeKind.PROGRESS
                and last.probe == event.probe):
            self._run_end = event  # the middle of a run: only its last is listed
            return
        self._end_run()
        self._append(event)

    def _end_run(self) -> None:
        if self._run_end is not None:
            self._append(self._run_end)
            self._run_end = None

    def _append(self, event: ProbeEvent) -> None:
        if self._listed < _MAX_EVENTS:
            self._last = EventModel.of(event)
            self._listed += 1
            if self._spool is not None:
                self._spool.add(self._last)
            else:
                self.events.append(self._last)
        else:
            self.omitted += 1

    def report(self) -> ReplayReport:
        self._end_run()
        failure = self.failures.choose()
        recovered = None
        if failure is not None and self._recovered and not self._fatal_seen:
            # The program went on after it (steps, phases) as the live watchdog's exit judge sees a
            # recovery: a DataLoader worker killed, then training on to its end.  Not the outcome,
            # yet said, as `status` says it of a done attempt: recovered.
            failure, recovered = None, failure
        return ReplayReport(
            outcome=_outcome(self.last_phase, failure, self.ready),
            last_phase=self.last_phase,
            failure=None if failure is None else FailureSummary(
                kind=failure.kind, line=failure.line, fingerprint=failure.fingerprint
            ),
            recovered=None if recovered is None else FailureSummary(
                kind=recovered.kind, line=recovered.line, fingerprint=recovered.fingerprint
            ),
            progress=[ProgressSummary(probe=run.bar.probe, bar=run.bar.label, process=run.bar.process,
                                      done=run.done, total=run.total) for run in self.progress.values()],
            events=self.events,
            events_omitted=self.omitted,
            counts=self.counts,
            highlights=self._spool.highlights if self._spool is not None else [],
        )


class _FailureCandidates:
    """The failures that may explain the log, in log order, for ``root_cause`` to choose from:
    the first ``_MAX_CANDIDATES`` fatal ones, and the survivable ones logged since the log last
    got ready (a later ready event handles those).  The root cause is among the first failures
    of a log, so keeping the first few bounds memory without changing the answer."""

    def __init__(self) -> None:
        self._seq = 0
        self._fatal: list[tuple[int, int, Failure]] = []  # (order, offset, failure)
        self._survivable: list[tuple[int, int, Failure]] = []
        self._went_on_from: list[tuple[int, int, Failure]] = []  # those before the latest recovery

    def recovered(self) -> None:
        """The program went on after the failures so far (a step, a new phase): a failure after
        this explains the log better; these explain it only if none comes."""
        if self._fatal or self._survivable:
            self._went_on_from = self._fatal + self._survivable
            self._fatal, self._survivable = [], []

    def ready_at(self, offset: int) -> None:
        if self._survivable:
            self._survivable = [c for c in self._survivable if c[1] >= offset]

    def add(self, failure: Failure, offset: int) -> None:
        self._seq += 1
        kept = self._survivable if failure.survivable else self._fatal
        if len(kept) < _MAX_CANDIDATES:
            kept.append((self._seq, offset, failure))

    def choose(self) -> Failure | None:
        latest = self._fatal + self._survivable
        if not latest or echoes_only([f for _, _, f in latest]):
            latest = self._went_on_from + latest
        return root_cause([f for _, _, f in sorted(latest, key=lambda c: c[0])])


def _outcome(last_phase: Phase | None, failure: Failure | None, ready: bool) -> Outcome:
    if failure is not None:
        return Outcome.OOM if failure.kind is FailureKind.CUDA_OOM else Outcome.CRASHED
    if last_phase is Phase.DONE:
        return Outcome.DONE
    return Outcome.READY if ready else Outcome.INCOMPLETE


def _counts(events: Iterable[EventModel]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[event.kind.value] = counts.get(event.kind.value, 0) + 1
    return counts


# ---- the CLI command ------------------------------------------------------------------


def probe_command(path: str, packs: list[str], pack_paths: list[str], as_json: bool) -> int:
    """``supervise probe``: print what a log shows.

    Exit status, as grep signals a match: 1 when the log shows a crash (outcome ``crashed``
    or ``oom``), 0 for any other outcome.  Errors are one line on stderr: 65 when no pack
    loads (a broken pack, an unknown name, none found at all), 66 when the log cannot be read.
    """
    # Memory stays flat however many events are listed.
    spool: EventSpool[EventModel] = EventSpool(keep_json=as_json)
    try:
        report = replay_file(path, packs or None, pack_paths, spool)
        if as_json:
            spool.write_json(report, sys.stdout)
        else:
            print(report.render_text())
    except SuperviseError as exc:
        print(f"supervise probe: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        raise  # the reader of our output went away (`| head`): not the log's fault; the CLI ends quietly
    except OSError as exc:
        print(f"supervise probe: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return _EX_NOINPUT
    finally:
        spool.close()
    return 1 if report.outcome in _CRASHED else 0


def _num(value: int | float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _clip(text: str, width: int = 120) -> str:
    text = text.replace("\t", " ")
    return text if len(text) <= width else text[: width - 1] + "…"
