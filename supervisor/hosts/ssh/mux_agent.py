"""The remote multiplexer: one resident program that follows many logs and watches many exits.

sshd allows ``MaxSessions`` (default 10) channels per connection, so one channel per followed
log caps a host at about eight jobs.  Instead one channel runs ``AGENT_PY`` (python3 on the
remote box) and carries every follow and exit watch of the host, in a small framed protocol:

    requests (one JSON line each)        events (one JSON line each, ``data`` followed by its bytes)
    follow  id path offset               start  id offset       where it really starts (0: another file)
    drain   id path offset               data   id n + n bytes  the log's next bytes, in order
    stop    id                           reset  id              truncated or replaced: from 0 again
    watch   key ("pid:start")            end    id              a drain reached the end of the file
    stats                                gone   key             that process ended
                                         stats  follows watches what it serves now

Followed files are read with inotify on their directories where ctypes can reach libc, and
are looked at every ``POLL_S`` anyway (a network file system may send no events); exits are
polled in /proc every 0.1 s (see _remote.WATCH_EXITS for why no remote process can wait for
them).  Bytes travel in the protocol's own order, so a truncation is never attributed to the
wrong side of the data around it.  The program exits when its stdin ends (the channel or the
connection closed).  Where the box has no python3 the host falls back to one channel per
follow (``MUX_SH`` prints ``nopython``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from supervisor.hosts._busy import BUSY_LINES_PER_S, BUSY_READ_INTERVAL_S

POLL_S = 0.25  # how often followed files are looked at without an inotify event
# A host whose logs run above BUSY_LINES lines/s in all is read at most every GATHER_S: many lines a
# frame, as the local follower does (the same numbers); quieter logs are sent the moment they are written.
GATHER_S = BUSY_READ_INTERVAL_S
BUSY_LINES = BUSY_LINES_PER_S
NO_PYTHON = b"nopython"
# The most bytes a data frame may announce: the agent sends at most 256 KiB a frame (its CHUNK).  A
# larger announcement is a protocol error (the channel is dropped and the logs followed again from
# their last offsets), never a read of that many bytes into memory.
MAX_FRAME_BYTES = 1 << 20

AGENT_PY = r'''
import ctypes, json, os, select, struct, sys, time
out = sys.stdout.buffer
CHUNK = 1 << 18
follows, watches, dirs, by_wd = {}, set(), {}, {}
def send(msg, data=b""):
    out.write(json.dumps(msg).encode() + b"\n" + data)
try:
    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
except Exception:
    libc, ino = None, -1
def watch_dir(path):
    d = os.path.dirname(path) or "."
    if ino >= 0 and d not in dirs:
        wd = libc.inotify_add_watch(ino, d.encode(), 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200)
        if wd >= 0:  # else (no such directory yet) the regular look finds the file; asked again next follow
            dirs[d], by_wd[wd] = wd, d
def touched_dirs():
    """The directories inotify reported changes in; None for all (the queue overflowed)."""
    try:
        buf = os.read(ino, 1 << 16)
    except OSError:
        return set()
    found, pos = set(), 0
    while pos + 16 <= len(buf):
        wd, mask, _, n = struct.unpack_from("iIII", buf, pos)
        pos += 16 + n
        if wd < 0 or mask & 0x4000:
            return None
        found.add(by_wd.get(wd))
    return found
def ident(st):
    return (st.st_dev, st.st_ino)
def start(msg, drain):
    i, path, off = msg["id"], msg["path"], msg["offset"]
    try:
        st = os.stat(path)
        seen = ident(st)
        if st.st_size < off:
            off = 0
    except OSError:
        seen = None
    follows[i] = [path, off, seen, drain, os.path.dirname(path) or "."]
    watch_dir(path)
    send({"ev": "start", "id": i, "offset": off})
def pump(i, f):
    """Send what the file gained; returns how many lines that was."""
    path, off, seen, drain, _ = f
    lines = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if drain:
            del follows[i]
            send({"ev": "end", "id": i})
        return 0
    try:
        st = os.fstat(fd)
        now = ident(st)
        if (seen is not None and now != seen) or st.st_size < off or (seen is None and off > 0):
            off = 0
            send({"ev": "reset", "id": i})
        f[2] = now
        while st.st_size > off:
            data = os.pread(fd, min(CHUNK, st.st_size - off), off)
            if not data:
                break
            off += len(data)
            lines += data.count(b"\n")
            send({"ev": "data", "id": i, "n": len(data)}, data)
            if not drain:
                break
        f[1] = off
    finally:
        os.close(fd)
    if drain:
        del follows[i]
        send({"ev": "end", "id": i})
    return lines
def alive(key):
    pid, _, want = key.partition(":")
    try:
        with open("/proc/%s/stat" % pid) as h:
            fields = h.read().rpartition(") ")[2].split()
    except (OSError, ValueError):
        return False
    return fields[0] not in ("Z", "X", "x") and (want == "-" or fields[19] == want)
def handle(msg):
    op = msg.get("op")
    if op in ("follow", "drain"):
        start(msg, op == "drain")
    elif op == "stop":
        follows.pop(msg["id"], None)
    elif op == "watch":
        watches.add(msg["key"])
    elif op == "stats":
        send({"ev": "stats", "follows": len(follows), "watches": len(watches)})
send({"ev": "hello", "inotify": ino >= 0})
out.flush()
pending, last_scan, last_watch = b"", 0.0, 0.0
held, last_data, lines, window, rate = set(), 0.0, 0, 0.0, 0.0  # held: dirs to read (None: all)
while True:
    fds = [0] + ([ino] if ino >= 0 else [])
    timeout = 0.1 if watches or ino < 0 else POLL_S
    if held != set():
        timeout = min(timeout, max(0.0, last_data + GATHER_S - time.monotonic()))
    ready = select.select(fds, [], [], timeout)[0]
    now = time.monotonic()
    if 0 in ready:
        data = os.read(0, 1 << 16)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                handle(json.loads(line))
    touched = touched_dirs() if ino in ready else set()
    if touched is None or 0 in ready or now - last_scan >= (POLL_S if ino >= 0 else 0.1):
        last_scan = now
        touched = None  # look at every file: a new follow, a lost event, a file system without events
    held = None if touched is None or held is None else held | touched
    if held != set() and (rate < BUSY_LINES or now - last_data >= GATHER_S):
        sent = 0
        for i, f in list(follows.items()):
            if i in follows and (held is None or f[4] in held):
                sent += pump(i, f)
        held = set()
        if sent:
            last_data, lines = now, lines + sent
    if now - window >= 0.1:  # the host's line rate, over windows of 0.1 s
        rate, lines, window = lines / (now - window), 0, now
    if watches and now - last_watch >= 0.1:
        last_watch = now
        for key in [k for k in watches if not alive(k)]:
            watches.discard(key)
            send({"ev": "gone", "key": key})
    out.flush()
'''.replace("POLL_S", repr(POLL_S)).replace("GATHER_S", repr(GATHER_S)).replace("BUSY_LINES", repr(BUSY_LINES))

# $1 python command, $2 the program.  The program reads the rest of the channel's stdin; its
# stdout is buffered and flushed once a round, so that one round's frames travel in one packet.
MUX_SH = r"""
if ! command -v "$1" >/dev/null 2>&1; then echo nopython; exit 0; fi
exec "$1" -c "$2"
"""


# -- typed messages on the daemon's side -----------------------------------------------------

@dataclass(frozen=True)
class Follow:
    id: int
    path: str
    offset: int
    drain: bool = False

    def line(self) -> bytes:
        op = "drain" if self.drain else "follow"
        return _line({"op": op, "id": self.id, "path": self.path, "offset": self.offset})


@dataclass(frozen=True)
class Stop:
    id: int

    def line(self) -> bytes:
        return _line({"op": "stop", "id": self.id})


@dataclass(frozen=True)
class Watch:
    key: str

    def line(self) -> bytes:
        return _line({"op": "watch", "key": self.key})


@dataclass(frozen=True)
class AskStats:
    def line(self) -> bytes:
        return _line({"op": "stats"})


Request = Follow | Stop | Watch | AskStats


@dataclass(frozen=True)
class Started:
    id: int
    offset: int


@dataclass(frozen=True)
class Data:
    id: int
    size: int  # the bytes follow the line; the reader fills them in
    data: bytes = b""


@dataclass(frozen=True)
class Reset:
    id: int


@dataclass(frozen=True)
class Ended:
    id: int


@dataclass(frozen=True)
class Gone:
    key: str


@dataclass(frozen=True)
class Stats:
    follows: int
    watches: int


@dataclass(frozen=True)
class Hello:
    inotify: bool


Event = Started | Data | Reset | Ended | Gone | Stats | Hello


class ProtocolError(ValueError):
    """A line the agent should never print."""


def parse_event(line: bytes) -> Event:
    try:
        msg = json.loads(line)
        kind = msg["ev"]
        if kind == "data":
            frame = Data(int(msg["id"]), int(msg["n"]))
        if kind == "start":
            return Started(int(msg["id"]), int(msg["offset"]))
        if kind == "reset":
            return Reset(int(msg["id"]))
        if kind == "end":
            return Ended(int(msg["id"]))
        if kind == "gone":
            return Gone(str(msg["key"]))
        if kind == "stats":
            return Stats(int(msg["follows"]), int(msg["watches"]))
        if kind == "hello":
            return Hello(bool(msg.get("inotify")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"unreadable line from the remote agent: {line[:200]!r}") from exc
    if kind != "data":
        raise ProtocolError(f"unknown event from the remote agent: {line[:200]!r}")
    if not 0 <= frame.size <= MAX_FRAME_BYTES:
        raise ProtocolError(f"the remote agent announced a data frame of {frame.size} bytes "
                            f"(at most {MAX_FRAME_BYTES} expected): {line[:200]!r}")
    return frame


def _line(msg: dict[str, object]) -> bytes:
    return json.dumps(msg).encode() + b"\n"
