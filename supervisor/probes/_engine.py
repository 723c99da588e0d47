"""The probe engine: records in, probe events out.

How a record is read:

1. ANSI codes and stacked prefixes are stripped (their named groups become fields).
   A line holding only a prefix (vLLM writes one before each ``\\r`` bar) lends its
   fields to the next line.
2. If a pack turned traceback capture on, the line may start, continue or end a
   multi-line traceback (see ``_traceback``); lines a traceback takes are not probed.
3. Otherwise the probes run.  **The first probe that matches wins**: packs in ascending
   ``priority``, probes in file order; one record gives at most one probe event.

Speed: a batch of records is joined and scanned by the prefilter (``_scan``): Hyperscan
with every probe regex where the package is there (``_hsfilter``), else one RE2
alternation of the probes' required literals (``_literals``).  Only records it names are
looked at in Python, through an ``re2.Set`` of all probes (which tells exactly which probes
match), then the winning probe's own regex for its groups; captured fields are converted by
``_fields``.  ``reader`` says which prefilter runs.  While a traceback is open every
record is read, since any line may belong to it.

Order and resuming: events come out in offset order.  While a traceback is still being
captured, events from its first record on are held back until it ends (from the first
record of the oldest traceback overlapping it, if several interleave).  So
``resume_offset`` (that first record, else the end of the last record fed; or a bare
prefix line whose fields the next line will need) is a point from which feeding the log
again to a fresh engine gives exactly the events not yet returned: none lost, none
doubled.  A daemon stores it with each batch of events it commits.

Log levels: a failure carries its ``level`` when the log header says it.  A
failure logged at DEBUG/INFO/WARNING is one the program handled; the offline replay
(``_replay``) ignores it when the log goes on to reach ``engine_ready`` or later (vLLM
logs a full WARNING traceback during a healthy ``vllm serve`` start with
``--skip-tokenizer-init``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

import re2

from supervisor.core.events import Failure, ProbeEvent, ProbeKind, Record
from supervisor.probes._barfold import RunFold
from supervisor.probes._classify import Classifier
from supervisor.probes._fields import CONVERTERS, Converter
from supervisor.probes._fingerprint import fingerprint
from supervisor.probes._kept import kept, of, save_patterns
from supervisor.probes._pack import Pack, Probe, re2_options
from supervisor.probes._prefix import ANSI_BYTES_RE, LineSplitter
from supervisor.probes._quiet import ChunkPlan, plan_chunk
from supervisor.probes._rootcause import FailureReader
from supervisor.probes._scan import KnownHits, Prefilter, Scanner, build_prefilter
from supervisor.probes._syntax import without_optional_tail
from supervisor.probes._traceback import TB_START, TracebackLine, TracebackTracker, capture_event

_UNANCHORED = re2._Anchor.UNANCHORED
_MAX_PREFIX_ONLY = 200  # a line longer than this is not a prefix alone


# ---- compiled probes ------------------------------------------------------------------


@kept("bar_form", lambda form: form, lambda raw: str(of(raw, str)))
def _bar_form(pattern: str) -> str:
    """``pattern`` as ``_barfold`` reads it: without its optional tail."""
    return without_optional_tail(pattern, RunFold.NAMES)


class _CompiledProbe:
    """A probe's regexes, compiled when first asked for: most probes of a log never match a line the
    prefilter names (the engine's set match says which do), and compiling all of them was a sixth of
    `supervise probe`'s start.  The four compiled slots start unset; reading one calls ``__getattr__``
    (Python calls it only for an attribute not found), which fills them all: no cost after that."""

    __slots__ = ("bar_form", "bar_layout", "bar_regex", "constants", "layout", "probe", "regex")
    regex: Any
    layout: list[tuple[int, str, Converter | None]]
    bar_regex: Any
    bar_layout: list[tuple[int, str, Converter | None]]

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.constants = probe.constants
        # What ``_barfold`` compares is read by the regex without its optional tail: the same match
        # and spans of these groups, at a fraction of the cost on a long line.  Looked up now, so that
        # what is worked out of a new regex is kept with the rest (``save_patterns``).
        self.bar_form = _bar_form(probe.regex)

    def __getattr__(self, name: str) -> Any:
        if name not in ("bar_layout", "bar_regex", "layout", "regex"):
            raise AttributeError(name)
        self._compile()
        return object.__getattribute__(self, name)

    def _compile(self) -> None:
        probe = self.probe
        compiled = re2.compile(probe.regex, re2_options())
        self.regex = compiled._regexp
        # (group index, field name, converter); None means the text as it is (hot path).
        self.layout = self._layout(compiled)
        bar_form = self.bar_form
        # Most probes have no optional tail: the same regex, compiled once (a compile each was a
        # tenth of `supervise probe`'s start).
        bar = compiled if bar_form == probe.regex else re2.compile(bar_form, re2_options())
        self.bar_regex = bar._regexp
        self.bar_layout = [entry for entry in self._layout(bar) if entry[1] in RunFold.NAMES]

    def _layout(self, compiled: Any) -> list[tuple[int, str, Converter | None]]:
        fields = self.probe.fields
        return [(idx, name, None if fields.get(name, "str") == "str" else CONVERTERS[fields[name]])
                for name, idx in sorted(compiled.groupindex.items())]

    def fields(self, data: bytes, line: str, bar: bool = False) -> dict[str, Any] | None:
        """The probe's fields if it matches (``data`` is ``line`` encoded); ``bar``: only those
        ``_barfold`` compares (with the constants), the rest not read."""
        spans = (self.bar_regex if bar else self.regex).Match(_UNANCHORED, data, 0, len(data))
        if spans[0][0] < 0:
            return None
        out: dict[str, Any] = self.constants.copy() if self.constants else {}
        same = len(data) == len(line)  # ASCII: byte offsets are character offsets
        for idx, name, convert in self.bar_layout if bar else self.layout:
            start, end = spans[idx]
            if start < 0:
                continue
            raw = line[start:end] if same else data[start:end].decode("utf-8", "replace")
            if convert is None:
                out[name] = raw
                continue
            try:
                value = convert(raw)
            except (ValueError, ZeroDivisionError):
                continue  # e.g. "?" where a number was expected: the field is left out
            if value is not None:
                out[name] = value
        return out


# ---- the engine -----------------------------------------------------------------------


class ProbeEngine:
    """Applies probe packs to the records of one log.

    ``start_offset`` is where feeding starts (a resumed log); it is ``resume_offset``
    until a record is fed.  ``feed``/``feed_many`` return the events that are complete;
    ``flush`` (at end of file or process exit) completes the rest.
    """

    def __init__(self, packs: Iterable[Pack], start_offset: int = 0, *, fold_runs: bool = False,
                 prefilter: bool = True) -> None:
        self.packs: tuple[Pack, ...] = tuple(sorted(packs, key=lambda p: (p.priority, p.name)))
        self._probes = [_CompiledProbe(p) for pack in self.packs for p in pack.probes]
        self._split = LineSplitter(
            [r for pack in self.packs for r in pack.prefixes], [r for pack in self.packs for r in pack.headers]
        )
        self._classify = Classifier(self.packs)
        self._failures = FailureReader(self.packs)
        self._set = self._probe_set()
        # prefilter=False: every record is read (what the prefilter must agree with; tests).
        self._prefilter: Prefilter | None
        self._always: bool
        self.reader: str
        if prefilter:
            self._prefilter, self._always, self.reader = build_prefilter(
                [cp.probe.regex for cp in self._probes], any(p.tracebacks for p in self.packs))
        else:
            self._prefilter, self._always, self.reader = None, bool(self._probes), "re2 (every record read)"
        tb_pack = next((p.name for p in self.packs if p.tracebacks), None)
        self._tb_probe = f"{tb_pack}.traceback" if tb_pack else None
        self._tracker = TracebackTracker()
        self._held: list[tuple[int, int, ProbeEvent]] = []
        self._seq = 0
        # Start of the oldest traceback of the current cluster (tracebacks overlapping in
        # the log, open or not): events from there on are held back, and a restart resumes
        # there, since the records in between belong to those tracebacks.
        self._hold_from: int | None = None
        self._end = start_offset
        self._last: Record | None = None
        self._last_read: tuple[int, str, dict[str, Any]] = (-1, "", {})  # (offset, line, fields)
        # Offline only (``_barfold``; ``resume_offset`` does not count a held line).
        self._fold = RunFold() if fold_runs and self._set is not None else None
        save_patterns()  # what was worked out of new patterns, for the next process

    # ---- building ---------------------------------------------------------------------

    def _probe_set(self) -> Any:
        if not self._probes:
            return None
        rset = re2.Set.SearchSet(re2_options(capture=False))
        for cp in self._probes:
            rset.Add(cp.probe.regex)
        rset.Compile()
        return rset._set

    # ---- feeding ----------------------------------------------------------------------

    @property
    def resume_offset(self) -> int:
        """Where to start feeding a fresh engine so that it returns exactly the events this
        one has not returned yet (for a daemon restart)."""
        if self._hold_from is not None:
            return self._hold_from
        if self._last is not None and self._last.end == self._end and self._prefix_only(self._last):
            return self._last.offset  # its fields are lent to the next line
        return self._end

    @property
    def folded(self) -> dict[int, list[float]]:
        """With ``fold_runs``: offset of a run's last line -> the counts of the lines folded
        before it (``_barfold``); the reader pops them.  Empty otherwise."""
        return self._fold.folded if self._fold is not None else {}

    @property
    def has_open_traceback(self) -> bool:
        """A traceback is being captured: its event comes with a later line or ``flush``."""
        return self._tracker.active

    def plan_chunk(self, data: bytes, base: int, final: bool) -> ChunkPlan | None:
        """Offline: which stretches of a chunk of raw log bytes (at log offset ``base``) to split
        and feed (``_quiet``); None: feed the whole chunk (no prefilter, or it must read every
        line)."""
        prefilter = self._prefilter
        if prefilter is None or self._always:
            return None
        return plan_chunk(data, base, final, prefilter.marks)

    def feed(self, record: Record) -> list[ProbeEvent]:
        """Feed one record; returns the events that are complete (see ``feed_many``)."""
        text = record.text
        if self._fold is not None or self._tracker.active or self._always or self._prefilter is None or "\n" in text:
            return self.feed_many((record,))
        # The batch path, minus its set-up: most records are skipped by one prefilter call.
        data = text.encode("utf-8", "replace")
        if b"\x1b" in data:
            data = ANSI_BYTES_RE.sub(b"", data)
        out: list[ProbeEvent] = []
        if self._prefilter.hit(data):
            self._read((record,), 0, out, probe=True)
        self._last = record
        self._end = record.end
        return out

    def feed_many(self, records: Sequence[Record], plan: ChunkPlan | None = None) -> list[ProbeEvent]:
        """Feed records in log order; returns the events that are complete.  ``plan``: that of
        the chunk these records are from (``plan_chunk``), whose scan says which to read."""
        out: list[ProbeEvent] = []
        n = len(records)
        if n == 0 or (self._prefilter is None and not self._always):
            self._advance(records)
            return out
        scanner: Scanner | KnownHits | None = None
        if plan is not None and self._prefilter is not None and not self._always:
            scanner = KnownHits(self._prefilter, records, plan.hits, plan.escapes, plan.base)
        elif self._prefilter is not None and not self._always:
            scanner = self._prefilter.scanner([r.text for r in records])
            if not scanner.ok:
                scanner = None  # a text with its own newline: read every record
        i = 0
        candidate = -1  # the next record (>= i) that some probe might match; n: none left
        fold = self._fold
        while i < n:
            if candidate < i:
                # The next line of a bar's run (the set match in ``_folds`` finds what the scan would).
                if fold is not None and fold.index >= 0 and not self._tracker.active and self._folds(records, i):
                    i += 1
                    continue
                found = scanner.next_candidate(i) if scanner is not None else i
                candidate = n if found is None else found
            if self._tracker.active:
                # An open traceback must see every line; only candidates are probed.
                self._unfold(out)
                self._read(records, i, out, probe=i == candidate)
                i += 1
            elif candidate < n:
                if self._fold is not None and self._folds(records, candidate):
                    i = candidate + 1
                    continue
                self._unfold(out)
                self._read(records, candidate, out, probe=True)
                i = candidate + 1
            else:
                break
        self._advance(records)
        return out

    def _advance(self, records: Sequence[Record]) -> None:
        if records:
            self._last = records[-1]
            self._end = records[-1].end

    def flush(self) -> list[ProbeEvent]:
        """End of the log, or a quiet one: finish open tracebacks and return every event
        still held.  Feeding may go on afterwards."""
        out: list[ProbeEvent] = []
        self._unfold(out)
        events = [self._traceback_event(cap) for cap in self._tracker.flush()]
        self._hold(events, out)
        return out

    def _folds(self, records: Sequence[Record], i: int) -> bool:
        """Whether record ``i`` joins the bar's run being folded (see ``_barfold``): then it is
        held, unread, as the run's last line so far."""
        fold = self._fold
        assert fold is not None
        record = records[i]
        text = record.text
        prev = records[i - 1] if i > 0 else self._last
        if (prev is None or not fold.same_key(text) or "\x1b" in text or _may_start_traceback(text)
                or (self._split.may_strip(text) and self._split.strip(text)[0] is not text)
                or (prev is not fold.last and self._lent_fields(records, i))):
            return False  # (the run's line before lends nothing: it has no prefix)
        data = text.encode("utf-8", "replace")
        hits = self._set.Match(data)
        if not hits or min(hits) != fold.index:
            return False
        probe = self._probes[fold.index]
        fields = probe.fields(data, text, bar=True)
        if fields is None or not fold.keeps_bar(fields):
            return False
        fold.hold(prev, record, fields["done"])
        return True

    def _unfold(self, out: list[ProbeEvent]) -> None:
        """The run being folded ends: its held last line is read in full."""
        if self._fold is not None and (held := self._fold.release()) is not None:
            self._read(held, 1, out, probe=True)
            self._fold.stop()

    # ---- one record -------------------------------------------------------------------

    def _read(self, records: Sequence[Record], i: int, out: list[ProbeEvent], *, probe: bool) -> None:
        record = records[i]
        text = record.text
        if self._split.may_strip(text):
            line, fields = self._split.strip(text)
        else:
            line, fields = text, {}
        self._last_read = (record.offset, line, fields)
        if not line or line.isspace():
            return  # blank, or a prefix alone (its fields go to the next line)
        if not fields:
            fields = self._lent_fields(records, i)
        events: list[ProbeEvent] = []
        if self._tb_probe is not None and (self._tracker.active or _may_start_traceback(line)):
            if TB_START in line and not line.startswith(TB_START):
                line, fields = self._split.unglue(line, TB_START) or (line, fields)
            consumed = self._traceback_line(record, line, fields, events, probe=probe)
            if consumed or not probe:
                self._hold(events, out)
                return
        if probe:
            events.extend(self._probe_line(record, line, fields))
        self._failures.saw(events)
        self._hold(events, out)

    def _traceback_line(
        self, record: Record, line: str, fields: dict[str, Any], events: list[ProbeEvent], *, probe: bool
    ) -> bool:
        header = self._split.header(line)
        key = (tuple(sorted(fields.items())), header.level, header.src)
        tl = TracebackLine(record.offset, key, line, header.message, header.ts, header.level, fields)

        def claimed() -> bool:
            # A line with no prefilter hit cannot match any probe.
            return probe and bool(self._matches(line.encode("utf-8", "replace")))

        consumed, finished = self._tracker.feed(tl, claimed)
        events.extend(self._traceback_event(cap) for cap in finished)
        return consumed

    def _traceback_event(self, cap: Any) -> ProbeEvent:
        assert self._tb_probe is not None
        frames = [frame for segment in cap.segments for frame in segment.frames]
        return self._failures.traceback_event(capture_event(cap, self._tb_probe, self._classify), frames)

    def _matches(self, data: bytes) -> list[int]:
        if self._set is None:
            return []
        return self._set.Match(data) or []

    def _probe_line(self, record: Record, line: str, prefix_fields: dict[str, Any]) -> list[ProbeEvent]:
        """The first matching probe's event; plus, when that probe is not a progress probe, the
        first matching progress probe's, placed first: a tqdm redraw that the next log line was
        written straight after (`... 72/72 [..][INFO|trainer.py:4309] Saving ...`) still
        advances its bar."""
        data = line.encode("utf-8", "replace")
        hits = self._set.Match(data) if self._set is not None else None
        if not hits:
            return []
        primary: ProbeEvent | None = None
        for index in sorted(hits) if len(hits) > 1 else hits:
            cp = self._probes[index]
            probe = cp.probe
            if primary is not None and probe.kind is not ProbeKind.PROGRESS:
                continue
            fields = cp.fields(data, line)
            if fields is None:
                continue
            if prefix_fields:
                fields = {**prefix_fields, **fields}
            if probe.kind is ProbeKind.FAILURE:
                event = self._failure_event(probe, record, line, fields)
            else:
                event = ProbeEvent(probe.kind, probe.name, record.offset, line, probe.phase, None, fields)
            if primary is not None:
                return [event, primary]
            if probe.kind is ProbeKind.PROGRESS:
                if self._fold is not None and not prefix_fields and line is record.text:
                    self._fold.start(index, cp.layout, probe.phase, record, fields)
                return [event]
            primary = event
        return [primary] if primary is not None else []

    def _failure_event(self, probe: Probe, record: Record, line: str, fields: dict[str, Any]) -> ProbeEvent:
        header = self._split.header(line)
        failure = Failure(
            kind=probe.failure or self._classify(header.message),
            line=line,
            fingerprint=fingerprint(probe.name, header.message),
            level=header.level,
        )
        failure = self._failures.line_failure(failure, classified=probe.failure is None, consequence=probe.consequence,
                                              fatal=probe.fatal)
        return ProbeEvent(probe.kind, probe.name, record.offset, line, probe.phase, failure, fields)

    def _lent_fields(self, records: Sequence[Record], i: int) -> dict[str, Any]:
        # Only the record just before can lend; its strip is usually at hand already.
        prev = records[i - 1] if i > 0 else self._last
        if prev is None or prev.end != records[i].offset or len(prev.text) > _MAX_PREFIX_ONLY:
            return {}
        offset, line, fields = self._last_read
        if offset != prev.offset:
            if not self._split.may_strip(prev.text):
                return {}
            line, fields = self._split.strip(prev.text)
        return fields if fields and (not line or line.isspace()) else {}

    def _prefix_only(self, record: Record) -> bool:
        line, fields = self._split.strip(record.text)
        return bool(fields) and not line.strip()

    # ---- ordering ---------------------------------------------------------------------

    def _hold(self, events: list[ProbeEvent], out: list[ProbeEvent]) -> None:
        """Release events in offset order, holding back those of an open traceback cluster."""
        if self._tracker.active:
            if self._hold_from is None:
                self._hold_from = self._tracker.min_offset()
        else:
            self._hold_from = None
        if not self._held and self._hold_from is None:
            out.extend(events)
            return
        for event in events:
            heapq.heappush(self._held, (event.offset, self._seq, event))
            self._seq += 1
        limit = self._hold_from
        while self._held and (limit is None or self._held[0][0] < limit):
            out.append(heapq.heappop(self._held)[2])


def _may_start_traceback(line: str) -> bool:
    return TB_START in line or 'File "' in line
