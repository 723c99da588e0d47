"""Python tracebacks spread over many records, folded into one failure event.

A traceback is followed per *key*: the line's stripped prefixes (process, rank, pid)
plus its log header's level and source.  Lines of one ``logger.exception`` record all
carry the same header, bare tracebacks carry none, and lines of other ranks or
processes have other keys, so interleaved tracebacks never merge.

The shape of a traceback, and how each line is read::

    Traceback (most recent call last):       starts a capture (text before it: the header text)
      File "x.py", line 3, in f              indented lines: frames, code, carets
        g()
    KeyError: 'a'                            the first line not indented: the exception line
    more message lines                       continuation: same header timestamp, or (bare)
                                             any line that no probe claims
    During handling of the above ...         a chained exception: the capture goes on
    Traceback (most recent call last): ...
    KeyError: Caught KeyError in ... 0.      torch re-raising a worker's exception: its
    Original Traceback (most recent call last):   "Original Traceback" is chained the same way

A capture also starts at a bare frame line (an excerpt that begins mid-traceback).  It
ends when its key prints something else, when another key prints after its exception
line, when it has been idle for ``max_idle`` records, or at ``flush``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from supervisor.core.events import Failure, FailureKind, ProbeEvent, ProbeKind
from supervisor.probes._fingerprint import fingerprint

TB_START = "Traceback (most recent call last):"
_DURING_HANDLING = "During handling of the above exception, another exception occurred:"
_DIRECT_CAUSE = "The above exception was the direct cause of the following exception:"
_CHAIN_MARKERS = (_DURING_HANDLING, _DIRECT_CAUSE)
# A frame of a with-block's cleanup: an exception raised there while an earlier one was
# unwinding through the block (a writer's __exit__ failing on the same full disk) is an echo.
_CLEANUP_FRAME = re.compile(r", in __exit__\s*$")
FRAME_RE = re.compile(r'\s+File "[^"]*", line \d+')
_EXC_LINE = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:::[A-Za-z_]\w*)*)(?::\s?(?P<msg>.*))?$")
# Final lines that only point elsewhere ("see root cause above"): an earlier exception of
# the chain says more.
_UNINFORMATIVE = re.compile(
    r"See root cause above|See stack trace for root cause|^KeyboardInterrupt\b|^SystemExit\b"
    r"|^(?:[\w.]+\.)?EngineDeadError\b"
)
# torch's ExceptionWrapper re-raising a worker's exception in the main process ("KeyError: Caught
# KeyError in DataLoader worker process 0.", DataParallel's "... in replica 0 on device 0."): its
# message carries the "Original Traceback": read as the next exception of a chain, it is the one
# the chain's rules choose (the last).
_REWRAPPED = re.compile(r"^(?:[\w.]+\.)?\w+: Caught \w+ in .+\.$")
_ORIGINAL_TB = "Original Traceback (most recent call last):"
# Kinds that name the root cause whatever was raised on top of them.
_INFRA_KINDS = (FailureKind.CUDA_OOM, FailureKind.DISTRIBUTED_TIMEOUT, FailureKind.NCCL, FailureKind.KILLED)
_CLASSIFY_CONTINUATION_LINES = 20
_MAX_LINE_CHARS = 4096  # a traceback keeps at most this much of each line

Key = tuple[Any, ...]
Classify = Callable[[str], FailureKind]


@dataclass
class Segment:
    """One exception of a (possibly chained) traceback."""

    frames: list[str] = field(default_factory=list)
    exc_line: str | None = None
    continuation: list[str] = field(default_factory=list)
    during_handling: bool = False  # raised while handling the previous segment's exception
    caused: bool = False  # raised `from` the previous segment's exception (its direct cause)

    def in_cleanup(self) -> bool:
        """Raised by a with-block's cleanup while the previous exception was unwinding."""
        return self.during_handling and any(_CLEANUP_FRAME.search(f) for f in self.frames)

    def text(self) -> str:
        return "\n".join([self.exc_line or "", *self.continuation[:_CLASSIFY_CONTINUATION_LINES]])


@dataclass
class Capture:
    key: Key
    offset: int  # the first record's offset
    first_line: str  # the first record's line (prefixes stripped)
    header_text: str  # text before "Traceback (most recent call last):" on the first line
    level: str | None
    fields: dict[str, Any]  # the prefixes' fields
    lines: list[str] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=lambda: [Segment()])
    state: str = "frames"  # frames | ended | chain
    chained_by: str = ""  # the chain marker that ended the last segment
    exc_ts: str | None = None  # the exception line's header timestamp
    idle: int = 0


class TracebackLine(NamedTuple):
    """One line as a traceback reads it (a tuple: made for every line while one is open,
    and a frozen dataclass costs twice as much to make)."""

    offset: int
    key: Key
    line: str  # prefixes stripped
    message: str  # header stripped too
    ts: str | None
    level: str | None
    fields: dict[str, Any]


class TracebackTracker:
    """The tracebacks being captured, one per key at most."""

    def __init__(self, max_idle: int = 64, max_lines: int = 2000, max_continuation: int = 100) -> None:
        # Bounds: another key's records before an unfinished traceback is given up on,
        # lines kept per traceback, and message lines after its exception line.
        self.open: dict[Key, Capture] = {}
        self._max_idle = max_idle
        self._max_lines = max_lines
        self._max_continuation = max_continuation

    @property
    def active(self) -> bool:
        return bool(self.open)

    def min_offset(self) -> int | None:
        return min((c.offset for c in self.open.values()), default=None)

    def feed(self, tl: TracebackLine, claimed: Callable[[], bool]) -> tuple[bool, list[Capture]]:
        """Read one non-blank line.  Returns (consumed, captures that ended).

        ``claimed()`` says whether a line probe matches the line; it is only asked about
        lines that might continue a bare traceback's message.
        """
        finished = self._age_others(tl.key)
        cap = self.open.get(tl.key)
        if cap is not None:
            cap.idle = 0
            consumed, done = self._continue(cap, tl, claimed)
            if consumed and len(cap.lines) >= self._max_lines:
                # No traceback is this long: whatever it is, stop holding events for it.
                finished.append(self.open.pop(tl.key))
            if consumed:
                return True, finished
            if done:
                finished.append(self.open.pop(tl.key))
        if TB_START in tl.message or FRAME_RE.match(tl.message):
            self._start(tl)
            return True, finished
        return False, finished

    def flush(self) -> list[Capture]:
        finished = sorted(self.open.values(), key=lambda c: c.offset)
        self.open.clear()
        return finished

    # ---- internals ------------------------------------------------------------------

    def _age_others(self, key: Key) -> list[Capture]:
        finished: list[Capture] = []
        for other, cap in list(self.open.items()):
            if other == key:
                continue
            cap.idle += 1
            # Another key printing after this one's exception line ends it (rank 0's
            # message is over once rank 1 speaks); an abandoned capture ends too.
            if cap.state == "ended" or cap.idle > self._max_idle:
                finished.append(self.open.pop(other))
        return finished

    def _continue(self, cap: Capture, tl: TracebackLine, claimed: Callable[[], bool]) -> tuple[bool, bool]:
        """(consumed, capture is over)."""
        msg = tl.message
        if cap.state == "frames":
            if msg[:1] in (" ", "\t"):  # frames, code, carets (and nested exception groups)
                self._add(cap, msg, frame=FRAME_RE.match(msg) is not None)
                return True, False
            if TB_START in msg:
                return False, True  # a new traceback before this one's exception line
            cap.segments[-1].exc_line = msg.strip()
            cap.state = "ended"
            cap.exc_ts = tl.ts
            self._add(cap, msg)
            return True, False
        if cap.state == "chain":
            if TB_START in msg:
                cap.segments.append(Segment(during_handling=cap.chained_by == _DURING_HANDLING,
                                            caused=cap.chained_by == _DIRECT_CAUSE))
                cap.state = "frames"
                self._add(cap, msg)
                return True, False
            return False, True
        # ended
        marker = next((m for m in _CHAIN_MARKERS if m in msg), None)
        if marker is not None:
            cap.state = "chain"
            cap.chained_by = marker
            self._add(cap, msg)
            return True, False
        if msg.strip() == _ORIGINAL_TB and _REWRAPPED.match(cap.segments[-1].exc_line or ""):
            cap.segments.append(Segment())
            cap.state = "frames"
            self._add(cap, msg)
            return True, False
        if TB_START in msg or not self._is_continuation(cap, tl, claimed):
            return False, True
        cap.segments[-1].continuation.append(msg.strip())
        self._add(cap, msg)
        return True, False

    def _is_continuation(self, cap: Capture, tl: TracebackLine, claimed: Callable[[], bool]) -> bool:
        if len(cap.segments[-1].continuation) >= self._max_continuation:
            return False
        if cap.exc_ts is not None or tl.ts is not None:
            # One logger record repeats its header, timestamp included, on every line.
            return tl.ts == cap.exc_ts
        return not claimed()

    def _start(self, tl: TracebackLine) -> None:
        idx = tl.message.find(TB_START)
        header_text = tl.message[:idx].strip().rstrip(",:;-").strip() if idx > 0 else ""
        cap = Capture(tl.key, tl.offset, tl.line, header_text, tl.level, tl.fields)
        if idx < 0:  # a bare frame: the excerpt starts mid-traceback
            cap.segments[0].frames.append(tl.message)
        self._add(cap, tl.message)
        self.open[tl.key] = cap

    def _add(self, cap: Capture, msg: str, *, frame: bool = False) -> None:
        if frame:
            cap.segments[-1].frames.append(msg)
        cap.lines.append(msg if len(msg) <= _MAX_LINE_CHARS else msg[:_MAX_LINE_CHARS] + " …")


# ---- from a capture to an event -------------------------------------------------------


def choose_segment(segments: list[Segment], classify: Classify) -> tuple[Segment, FailureKind] | None:
    """The exception of a chain that says most about the root cause.

    An infrastructure kind (CUDA OOM, NCCL, timeout, SIGKILL) anywhere in the chain wins,
    the earliest first, but never a re-raise that only names it (``Caught OutOfMemoryError in
    replica 0 on device 0.``) over the exception it carries (the CUDA OOM message itself);
    otherwise the last exception, the one the program raised in the end (``raise X from Y``
    says what failed in the program's own words: ``cannot resume: checkpoint ... is missing``
    over ``FileNotFoundError``), unless it only points elsewhere, merely wraps an earlier one
    (its message quotes that one's line: huggingface_hub's
    ``StrictDataclassClassValidationError`` around the config's ``ValueError``), or was
    raised by a with-block's ``__exit__`` while the earlier one unwound through it
    (torch.save's zip writer failing to close after the write itself failed).
    """
    ended = [s for s in segments if s.exc_line]
    if not ended:
        return None
    kinds = [classify(s.text()) for s in ended]
    infra = [(seg, kind) for seg, kind in zip(ended, kinds, strict=True) if kind in _INFRA_KINDS]
    if infra:
        carried = [(seg, kind) for seg, kind in infra if not _REWRAPPED.match(seg.exc_line or "")]
        return (carried or infra)[0]
    for index in reversed(range(len(ended))):
        seg = ended[index]
        if _UNINFORMATIVE.search(seg.exc_line or "") or (index > 0 and seg.in_cleanup()):
            continue
        message = "\n".join(seg.continuation)
        quoted = next((i for i in range(index) if (line := ended[i].exc_line) and line in message), None)
        return (ended[index], kinds[index]) if quoted is None else (ended[quoted], kinds[quoted])
    return ended[-1], kinds[-1]


def capture_event(cap: Capture, probe: str, classify: Classify) -> ProbeEvent:
    """The failure event of a finished capture."""
    fields: dict[str, Any] = dict(cap.fields)
    chosen = choose_segment(cap.segments, classify)
    if chosen is not None:
        seg, kind = chosen
        line = seg.exc_line or cap.first_line
        exc = _EXC_LINE.match(line)
        exc_type = exc.group("type") if exc else ""
        message = (exc.group("msg") or "") if exc else line
        fields["exc_type"] = exc_type
        frame = seg.frames[-1] if seg.frames else None
    else:
        # Truncated before any exception line: what came before "Traceback" is all we have.
        line = cap.first_line
        kind = classify(cap.header_text or cap.first_line)
        exc_type, message, frame = "Traceback", cap.header_text, None
    if len(cap.segments) > 1:
        fields["chained"] = len(cap.segments)
    return ProbeEvent(
        kind=ProbeKind.FAILURE,
        probe=probe,
        offset=cap.offset,
        line=line,
        failure=Failure(
            kind=kind,
            line=line,
            fingerprint=fingerprint(exc_type or "Exception", message, frame),
            traceback="\n".join(cap.lines),
            level=cap.level,
        ),
        fields=fields,
    )
