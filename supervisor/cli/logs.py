"""Reading a job: `logs` (the attempt's output) and `events` (what the probes and the watchdog
recorded), with journalctl's `-n N` and `--since`, and following a job until it ends."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from queue import Empty, Queue
from threading import Thread
from typing import Any

from supervisor.cli._args import client as _client
from supervisor.cli.client import Client
from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.errors import NotFound
from supervisor.core.events import EventKind, JobState
from supervisor.core.payloads import ProbeFields, StateData


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client()
    if args.events:
        return _print_events(client, args, kinds=[])
    attempt = args.attempt or _latest_attempt(client, args.job)
    after = _last_line_before(client, args.job, attempt, args.since) if args.since is not None else -1
    chunks = _log_chunks(client, args.job, attempt, after, args.lines, args.follow, args.grep, args.timestamps)
    printer = _LogPrinter(timestamps=args.timestamps)
    # Piped and following, a bar's unterminated latest redraw would wait for the next one, which a
    # frozen bar never draws: the quiet after it is what prints it.
    printer.print_all(_with_quiet(chunks, _PARTIAL_SETTLE_S) if args.follow and not printer.tty else chunks)
    return 0


# How long a bar's unterminated redraw must stay the latest before piped `logs -f` prints it: a
# moving bar's next redraw comes well before (it is printed complete instead, once), a frozen one's never.
_PARTIAL_SETTLE_S = 1.0


def _with_quiet(chunks: Iterator[protocol.LogChunk], quiet_s: float) -> Iterator[protocol.LogChunk | None]:
    """The chunks, and None each time ``quiet_s`` passes with none (the stream blocks on the
    daemon: it is read on a thread of its own, which ends with it)."""
    queue: Queue[protocol.LogChunk | BaseException | None] = Queue(maxsize=1024)

    def read() -> None:
        try:
            for chunk in chunks:
                queue.put(chunk)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread, raised there
            queue.put(exc)
            return
        queue.put(None)

    Thread(target=read, name="logs-follow", daemon=True).start()
    while True:
        try:
            item = queue.get(timeout=quiet_s)
        except Empty:
            yield None
            continue
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _latest_attempt(client: Client, job: str) -> int:
    attempts = client.attempts(job).attempts
    if not attempts:
        raise NotFound(f"job '{job}' has no attempts yet")
    return attempts[-1].n


def _last_line_before(client: Client, job: str, attempt: int, since: float) -> int | None:
    """The offset of the last line known to be written before `since`: the lines after it are
    shown.  Log lines carry no time; the probes' events do, with the offset of the line they
    matched, so this never misses a later line.  -1: none known (the whole log); None: the
    attempt ended before `since` (nothing)."""
    row = next((a for a in client.attempts(job).attempts if a.n == attempt), None)
    if row is None:
        raise NotFound(f"job '{job}' has no attempt {attempt}; `supervise attempts {job}` lists them")
    if row.ended is not None and row.ended < since:
        return None
    before = [e.offset for e in client.all_events(job, attempt) if e.offset is not None and e.ts < since]
    return max(before, default=-1)


def _log_chunks(client: Client, job: str, attempt: int, after: int | None, last: int | None,
                follow: bool, grep: Any = None, timestamps: bool = False) -> Iterator[protocol.LogChunk]:
    """The log's records that start after offset `after` (-1: all); with `last`, only the last
    N of them, then (with `follow`) everything written later; with `grep`, only the whole records
    it matches (matched before `last` counts them, as `grep | tail -n` would)."""
    if after is None:
        return

    def wanted(chunk: protocol.LogChunk) -> bool:
        return grep is None or (not chunk.partial and grep.search(chunk.text) is not None)

    start = max(after, 0)
    if last is not None:
        tail: deque[protocol.LogChunk] = deque(maxlen=last)
        for chunk in client.follow_log(job, attempt=attempt, follow=False, offset=start, timestamps=timestamps):
            if not chunk.end and not chunk.partial and chunk.offset > after and wanted(chunk):
                keep_last_visible(tail, chunk, overwrite=sys.stdout.isatty())
        if not follow:
            yield from tail
            return
        if tail:
            start = tail[0].offset
            after = start - 1
    for chunk in client.follow_log(job, attempt=attempt, follow=follow, offset=start, timestamps=timestamps):
        if chunk.end:
            return
        if (chunk.offset > after or chunk.partial) and wanted(chunk):
            yield chunk


def keep_last_visible(tail: deque[protocol.LogChunk], chunk: protocol.LogChunk, *, overwrite: bool) -> None:
    """Add ``chunk`` to the last lines kept for `-n`.  On a terminal (``overwrite``) a redraw is
    overwritten by whatever comes next, so it is not a line a person sees: -n counts those."""
    if overwrite and tail and tail[-1].redraw:
        tail.pop()
    tail.append(chunk)


class _LogPrinter:
    """Raw lines; on a terminal a tqdm redraw overwrites the previous one."""

    def __init__(self, *, timestamps: bool = False) -> None:
        self.tty = sys.stdout.isatty()
        self.redraw_pending = False
        self.timestamps = timestamps
        self.held: protocol.LogChunk | None = None  # piped: the latest unterminated redraw, not printed yet
        self.settled: tuple[int, str] | None = None  # piped: the one printed once it settled (offset, text)

    def print_all(self, chunks: Iterable[protocol.LogChunk | None]) -> None:
        """``None`` among the chunks: the stream has been quiet for a moment (see ``_with_quiet``)."""
        for chunk in chunks:
            if chunk is None:
                self._settle()
            else:
                self.show(chunk)
        if self.redraw_pending:
            sys.stdout.write("\n")

    def _settle(self) -> None:
        """Piped: the held redraw has stayed the latest for a moment: it is where the bar stands, print it."""
        held, self.held = self.held, None
        if held is not None:
            sys.stdout.write(self._stamp(held) + held.text + "\n")
            sys.stdout.flush()
            self.settled = (held.offset, held.text)

    def show(self, chunk: protocol.LogChunk) -> None:
        if chunk.partial and not self.tty:
            self.held = chunk  # an unterminated redraw: printed once it is complete, or once it settles
            return
        if not self.tty:
            self.held = None  # whatever came after it is later news
            settled, self.settled = self.settled, None
            if settled == (chunk.offset, chunk.text):
                return  # the redraw printed when it settled, now complete: once is enough
        if chunk.redraw and self.tty:
            # A tqdm redraw replaces the previous state: overwrite the line, cut to the
            # terminal's width (a wrapped line cannot be overwritten by \r).
            sys.stdout.write("\r\x1b[2K" + _fit_line(self._stamp(chunk) + chunk.text))
            sys.stdout.flush()
            self.redraw_pending = True
            return
        if self.redraw_pending:
            sys.stdout.write("\r\x1b[2K")
            self.redraw_pending = False
        sys.stdout.write(self._stamp(chunk) + chunk.text + "\n")
        sys.stdout.flush()

    def _stamp(self, chunk: protocol.LogChunk) -> str:
        """journalctl's way: each line's arrival time first (to the second; '?' where not known)."""
        if not self.timestamps:
            return ""
        return (_fmt.timestamp(chunk.ts) if chunk.ts is not None else "????-??-?? ??:??:??") + " "


def _fit_line(text: str) -> str:
    from rich.cells import cell_len, set_cell_size

    width = max(10, shutil.get_terminal_size().columns - 1)
    return text if cell_len(text) <= width else set_cell_size(text, width)


def cmd_events(args: argparse.Namespace) -> int:
    return _print_events(_client(), args, kinds=args.kinds)


def _print_events(client: Client, args: argparse.Namespace, kinds: list[str]) -> int:
    since: float | None = getattr(args, "since", None)
    last: int | None = getattr(args, "lines", None)
    stored = list(client.all_events(args.job, args.attempt, kinds=kinds))  # every page, not the first 10,000
    recent = [e for e in stored if since is None or e.ts >= since]
    shown = recent[-last:] if last is not None else recent
    printer = _EventPrinter(as_json=getattr(args, "json", False))
    for event in shown:
        printer.show(event)
    if args.follow:
        after = stored[-1].id if stored else 0
        for event in client.follow_events(args.job, attempt=args.attempt, after=after, kinds=kinds):
            printer.show(event)
    printer.close()
    return 0


def follow_job(client: Client, job: str, attempt: int) -> int:
    """Print the job's events from `attempt` on until it ends; exit 0 if it is done, else 1."""
    printer = _EventPrinter()
    for event in client.follow_events(job, min_attempt=attempt, until_done=True):
        printer.show(event)
    printer.close()
    status = client.status(job).jobs[0]
    print(f"supervise: {job} {status.state}: {status.reason}")
    return 0 if status.state is JobState.DONE else 1


_PIPED_BAR_EVERY_S = 1.0  # piped, a moving bar is printed at most this often (and at each whole percent)


class _EventPrinter:
    """One line per event; progress on a terminal is a single updating line.  Piped (a file, `tee`,
    `less`), a bar is printed when it starts, at each whole percent, at most once a second
    otherwise, and as it ends (its latest state before the next other event, or at the end): a
    20,000-step bar is about a hundred lines, not 20,000."""

    def __init__(self, as_json: bool = False) -> None:
        self.as_json = as_json
        self.tty = sys.stdout.isatty()
        self.progress_open = False
        self.last_progress: dict[str, Any] = {}
        self._printed: dict[str, tuple[Any, int | None, float]] = {}  # bar -> (done, percent, wall time) printed
        self._unprinted: dict[str, str] = {}  # bar -> its latest line, not printed yet (piped)
        # What each attempt's lines have said already, so that its verdict and the job's state after
        # it do not say the failure again (a failure once, not three times an attempt).
        self._failure_said: dict[int, str] = {}  # attempt -> the failure line printed
        self._judged: set[int] = set()  # attempts whose verdict was printed

    def show(self, event: protocol.EventInfo) -> None:
        if self.as_json:
            print(event.model_dump_json(), flush=True)
            return
        if event.kind is EventKind.PROGRESS:
            self._progress(event)
            return
        self._end_progress()
        detail = event.message
        if event.kind is EventKind.PHASE and event.phase:
            detail = event.phase  # one name per phase: the canonical one (the line itself is in `logs`)
        elif event.kind is EventKind.FAILURE:
            detail = f"{event.failure.kind if event.failure else 'failure'}: {event.message}"
            self._failure_said.setdefault(event.attempt, event.message)
        elif event.kind is EventKind.VERDICT:
            said = self._failure_said.get(event.attempt)
            if said and detail.endswith(f": {said}"):
                detail = detail[: -len(said) - 2]  # "crashed: exited 1": the failure is the line above
            self._judged.add(event.attempt)
        elif event.kind is EventKind.STATE and event.attempt in self._judged:
            state = StateData.of(event).state
            if state is not None and state is not JobState.RUNNING:
                detail = state.value  # its reason repeats the verdict and the action just printed
        print(f"{_fmt.clock(event.ts)} #{event.attempt} {event.kind:<8} {detail}", flush=True)

    def _progress(self, event: protocol.EventInfo) -> None:
        payload = ProbeFields.of(event)
        progress = payload.progress
        done, total = (progress.done, progress.total) if progress is not None else (None, None)
        extra = "".join(f" {name}={_fmt.figure(value)}" for name, value in payload.figures())
        line = f"{_fmt.clock(event.ts)} #{event.attempt} progress {event.probe}: {_fmt.num(done)}/{_fmt.num(total)}{extra}"
        bar = event.probe or ""
        if self.tty:
            sys.stdout.write("\r\x1b[2K" + line)
            sys.stdout.flush()
            self.progress_open = True
        elif self.last_progress.get(bar) != done:
            percent = int(done * 100 // total) if isinstance(done, (int, float)) and isinstance(total, (int, float)) \
                and total > 0 else None
            printed = self._printed.get(bar)
            if (printed is None or percent != printed[1] or time.monotonic() - printed[2] >= _PIPED_BAR_EVERY_S
                    or (total is not None and done == total)):
                print(line, flush=True)
                self._printed[bar] = (done, percent, time.monotonic())
                self._unprinted.pop(bar, None)
            else:
                self._unprinted[bar] = line
        self.last_progress[bar] = done

    def _end_progress(self) -> None:
        if self.progress_open:
            sys.stdout.write("\n")
            self.progress_open = False
        for line in self._unprinted.values():  # each bar's latest state, before what comes next
            print(line, flush=True)
        self._unprinted.clear()

    def close(self) -> None:
        self._end_progress()
