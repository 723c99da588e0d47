"""The remote agent: one program on the SSH box that follows many logs and watches many exits.

This file is the program itself.  The daemon sends its text over the agent's channel and the
box runs it with ``python3 -c`` (``mux_agent.MUX_SH``); it is imported here only so that its
functions can be tested in-process and checked like the rest of the code.  Hence the rules
it lives by: the standard library only, nothing imported from the supervisor, and nothing
newer than ``MIN_PYTHON`` (the box's Python may be old; ``MUX_SH`` refuses older ones).

It speaks the framed protocol described in ``mux_agent``: one JSON request a line on stdin,
one JSON event a line on stdout (a ``data`` event followed by its bytes).  Followed files are
read with inotify on their directories where ctypes can reach libc, and looked at every
``POLL_S`` anyway (a network file system may send no events); exits are polled in /proc every
0.1 s (a process started by an earlier SSH session cannot be waited for).  The program exits
when its stdin ends (the channel or the connection closed).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import struct
import sys
import time
from typing import IO, Any

MIN_PYTHON = (3, 8)  # the oldest Python this file is written for (tests parse it with that grammar)
POLL_S = 0.25  # how often followed files are looked at without an inotify event
# A host whose logs run above BUSY_LINES lines/s in all is read at most every GATHER_S: many lines a
# frame, as the local follower does (hosts._busy's two numbers, repeated here: this program imports
# nothing of the supervisor; a test checks they agree).  Quieter logs are sent the moment they are written.
GATHER_S = 0.02
BUSY_LINES = 500.0
WATCH_S = 0.1  # how often watched processes are looked up in /proc
CHUNK = 1 << 18  # the most bytes one data frame carries (mux_agent.MAX_FRAME_BYTES allows more)

# inotify(7): what changes a followed file or its directory entry, and the queue's overflow.
_IN_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200  # MODIFY ATTRIB CLOSE_WRITE MOVED_FROM/TO CREATE DELETE
_IN_Q_OVERFLOW = 0x4000
_IN_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class Followed:
    """One followed file: where it is read up to, and which file (device, inode) that was."""

    __slots__ = ("directory", "drain", "offset", "path", "seen")

    def __init__(self, path: str, offset: int, seen: tuple[int, int] | None, drain: bool) -> None:
        self.path = path
        self.offset = offset
        self.seen = seen
        self.drain = drain
        self.directory = os.path.dirname(path) or "."


class Inotify:
    """inotify on the followed files' directories, through libc; ``fd`` is -1 where it cannot be had."""

    def __init__(self) -> None:
        self._libc: ctypes.CDLL | None
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            self.fd: int = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except Exception:  # noqa: BLE001 - no libc, no inotify: the regular look does the work
            self._libc, self.fd = None, -1
        self._dirs: dict[str, int] = {}
        self._by_wd: dict[int, str] = {}

    def watch(self, directory: str) -> None:
        if self._libc is None or self.fd < 0 or directory in self._dirs:
            return
        wd: int = self._libc.inotify_add_watch(self.fd, directory.encode(), _IN_MASK)
        if wd >= 0:  # else (no such directory yet) the regular look finds the file; asked again next follow
            self._dirs[directory], self._by_wd[wd] = wd, directory

    def touched(self) -> set[str | None] | None:
        """The directories inotify reported changes in; None for all (the queue overflowed)."""
        try:
            buf = os.read(self.fd, 1 << 16)
        except OSError:
            return set()
        return touched_dirs(buf, self._by_wd)


def touched_dirs(buf: bytes, by_wd: dict[int, str]) -> set[str | None] | None:
    """The directories named by the inotify events in ``buf``; None when the queue overflowed."""
    found: set[str | None] = set()
    pos = 0
    while pos + _IN_EVENT.size <= len(buf):
        wd, mask, _, n = _IN_EVENT.unpack_from(buf, pos)
        pos += _IN_EVENT.size + n
        if wd < 0 or mask & _IN_Q_OVERFLOW:
            return None
        found.add(by_wd.get(wd))
    return found


def ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def alive(key: str, proc: str = "/proc") -> bool:
    """Whether the process ``key`` ("pid:start", start '-' for any) lives; a zombie counts as gone."""
    pid, _, want = key.partition(":")
    try:
        with open(f"{proc}/{pid}/stat") as handle:
            fields = handle.read().rpartition(") ")[2].split()
    except (OSError, ValueError):
        return False
    return len(fields) > 19 and fields[0] not in ("Z", "X", "x") and (want == "-" or fields[19] == want)


class Agent:
    """What the agent serves (follows, watches) and the events it writes to ``out``."""

    def __init__(self, out: IO[bytes], inotify: Inotify | None = None) -> None:
        self.out = out
        self.inotify = inotify
        self.follows: dict[int, Followed] = {}
        self.watches: set[str] = set()

    def send(self, msg: dict[str, object], data: bytes = b"") -> None:
        self.out.write(json.dumps(msg).encode() + b"\n" + data)

    def handle(self, msg: dict[str, Any]) -> None:
        """One request."""
        op = msg.get("op")
        if op in ("follow", "drain"):
            self.start(int(msg["id"]), str(msg["path"]), int(msg["offset"]), op == "drain")
        elif op == "stop":
            self.follows.pop(msg["id"], None)
        elif op == "watch":
            self.watches.add(str(msg["key"]))
        elif op == "stats":
            self.send({"ev": "stats", "follows": len(self.follows), "watches": len(self.watches)})

    def start(self, i: int, path: str, offset: int, drain: bool) -> None:
        """Follow (or drain) ``path`` from ``offset``; 0 when the file is shorter (another file)."""
        try:
            st = os.stat(path)
            seen: tuple[int, int] | None = ident(st)
            if st.st_size < offset:
                offset = 0
        except OSError:
            seen = None
        f = self.follows[i] = Followed(path, offset, seen, drain)
        if self.inotify is not None:
            self.inotify.watch(f.directory)
        self.send({"ev": "start", "id": i, "offset": offset})

    def pump(self, i: int, f: Followed) -> int:
        """Send what the file gained (a drain: all of it, then its end); how many lines that was."""
        lines = 0
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except OSError:
            if f.drain:
                del self.follows[i]
                self.send({"ev": "end", "id": i})
            return 0
        try:
            st = os.fstat(fd)
            now = ident(st)
            off = f.offset
            if (f.seen is not None and now != f.seen) or st.st_size < off or (f.seen is None and off > 0):
                off = 0
                self.send({"ev": "reset", "id": i})
            f.seen = now
            while st.st_size > off:
                data = os.pread(fd, min(CHUNK, st.st_size - off), off)
                if not data:
                    break
                off += len(data)
                lines += data.count(b"\n")
                self.send({"ev": "data", "id": i, "n": len(data)}, data)
                if not f.drain:
                    break  # one frame a follow a round: every follow gets its turn
            f.offset = off
        finally:
            os.close(fd)
        if f.drain:
            del self.follows[i]
            self.send({"ev": "end", "id": i})
        return lines

    def pump_all(self, held: set[str | None] | None) -> int:
        """Pump every follow in the directories ``held`` (None: all); the lines sent."""
        sent = 0
        for i, f in list(self.follows.items()):
            if i in self.follows and (held is None or f.directory in held):
                sent += self.pump(i, f)
        return sent

    def check_exits(self, proc: str = "/proc") -> None:
        for key in [k for k in self.watches if not alive(k, proc)]:
            self.watches.discard(key)
            self.send({"ev": "gone", "key": key})


def serve(stdin: int, agent: Agent) -> None:
    """Answer requests from the fd ``stdin`` until it ends; each round's frames flushed at once,
    so that they travel in one packet."""
    ino = agent.inotify.fd if agent.inotify is not None else -1
    agent.send({"ev": "hello", "inotify": ino >= 0})
    agent.out.flush()
    pending, last_scan, last_watch = b"", 0.0, 0.0
    held: set[str | None] | None = set()  # the directories to read (None: all)
    last_data, lines, window, rate = 0.0, 0, 0.0, 0.0
    while True:
        fds = [stdin] + ([ino] if ino >= 0 else [])
        timeout = WATCH_S if agent.watches or ino < 0 else POLL_S
        if held != set():
            timeout = min(timeout, max(0.0, last_data + GATHER_S - time.monotonic()))
        ready = select.select(fds, [], [], timeout)[0]
        now = time.monotonic()
        asked = stdin in ready
        if asked:
            data = os.read(stdin, 1 << 16)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    agent.handle(json.loads(line))
        touched = agent.inotify.touched() if agent.inotify is not None and ino in ready else set()
        if touched is None or asked or now - last_scan >= (POLL_S if ino >= 0 else WATCH_S):
            last_scan = now
            touched = None  # look at every file: a new follow, a lost event, a file system without events
        held = None if touched is None or held is None else held | touched
        if held != set() and (rate < BUSY_LINES or now - last_data >= GATHER_S):
            sent = agent.pump_all(held)
            held = set()
            if sent:
                last_data, lines = now, lines + sent
        if now - window >= 0.1:  # the host's line rate, over windows of 0.1 s
            rate, lines, window = lines / (now - window), 0, now
        if agent.watches and now - last_watch >= WATCH_S:
            last_watch = now
            agent.check_exits()
        agent.out.flush()


def main() -> None:
    serve(0, Agent(sys.stdout.buffer, Inotify()))


if __name__ == "__main__":
    main()
