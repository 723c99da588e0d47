"""The remote multiplexer: one resident program that follows many logs and watches many exits.

sshd allows ``MaxSessions`` (default 10) channels per connection, so one channel per followed
log caps a host at about eight jobs.  Instead one channel runs the agent (``_agent_program``,
whose text ``agent_source()`` sends to python3 on the remote box) and carries every follow and
exit watch of the host, in a small framed protocol:

    requests (one JSON line each)        events (one JSON line each, ``data`` followed by its bytes)
    follow  id path offset               start  id offset       where it really starts (0: another file)
    drain   id path offset               data   id n + n bytes  the log's next bytes, in order
    stop    id                           reset  id              truncated or replaced: from 0 again
    watch   key ("pid:start")            end    id              a drain reached the end of the file
    stats                                gone   key             that process ended
                                         stats  follows watches what it serves now

Bytes travel in the protocol's own order, so a truncation is never attributed to the wrong
side of the data around it.  The agent needs a Python 3 on the box (``MIN_PYTHON`` or newer):
GPU boxes running the jobs supervised here have one, and ``SUPERVISE_SSH_PYTHON`` names it where
it is not ``python3`` on the PATH.  Where there is none (or it is too old, or does not run),
``MUX_SH`` answers so instead of the agent's hello, and ``NoAgent`` says what to do, in one line.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
from dataclasses import dataclass

from supervisor.hosts.ssh import _agent_program
from supervisor.hosts.ssh.target import ENV_PYTHON

# The most bytes a data frame may announce: the agent sends at most 256 KiB a frame (its CHUNK).  A
# larger announcement is a protocol error (the channel is dropped and the logs followed again from
# their last offsets), never a read of that many bytes into memory.
MAX_FRAME_BYTES = 1 << 20


@functools.cache
def agent_source() -> str:
    """The agent program's text, as the box runs it: its module's file, read once."""
    return inspect.getsource(_agent_program)


MIN_PYTHON = _agent_program.MIN_PYTHON
_MIN = ".".join(map(str, MIN_PYTHON))

# $1 python command, $2 the program.  First the command is asked its version (a line any Python,
# 2 included, can print): "nopython" where there is no such command, "oldpython X.Y.Z" where it is
# older than MIN_PYTHON, "badpython WHAT IT SAID" where it does not run as Python.  Else the program
# runs and reads the rest of the channel's stdin; its stdout is buffered and flushed once a round,
# so that one round's frames travel in one packet.
MUX_SH = r"""
py=$1
if ! command -v "$py" >/dev/null 2>&1; then echo nopython; exit 0; fi
out=$("$py" -c 'import sys; v = sys.version_info; print("%s %d.%d.%d" % ("ok" if v >= (@MIN@,) else "old", v[0], v[1], v[2]))' \
      </dev/null 2>&1)
v=$(printf '%s\n' "$out" | tail -n 1)  # the last line: warnings the interpreter printed come first
case $v in
  "ok "*) exec "$py" -c "$2" ;;
  "old "*) echo "oldpython ${v#old }" ;;
  *) echo "badpython $(printf '%s\n' "${out:-it printed nothing}" | head -n 1 | cut -c1-200)" ;;
esac
""".replace("@MIN@", ", ".join(map(str, MIN_PYTHON)))


class NoAgentWhy(enum.Enum):
    """Why the agent cannot start on the box: ``MUX_SH``'s answer in place of the agent's hello."""

    MISSING = "nopython"
    OLD = "oldpython"
    BROKEN = "badpython"


@dataclass(frozen=True)
class NoAgent:
    why: NoAgentWhy
    detail: str  # the version found, or what the command said

    def message(self, python: str, where: str) -> str:
        """One line that says what to do."""
        fix = f"install Python {_MIN} or newer there, or set {ENV_PYTHON} to one"
        if self.why is NoAgentWhy.MISSING:
            if python == "python3":
                return f"no python3 on {where}: {fix} (the supervisor's agent, which follows the logs there, runs on it)"
            return f"{ENV_PYTHON}={python} is not found on {where}: set it to a Python {_MIN} or newer there"
        if self.why is NoAgentWhy.OLD:
            return f"{python} on {where} is Python {self.detail}, too old for the supervisor's agent: {fix}"
        return f"{python} on {where} does not run as Python ({self.detail}): {fix}"


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


def parse_hello(line: bytes) -> Hello | NoAgent:
    """The first line after the script's marker: the agent's hello, or why it cannot start."""
    word, _, rest = line.decode(errors="replace").strip().partition(" ")
    for why in NoAgentWhy:
        if word == why.value:
            return NoAgent(why, rest.strip())
    event = parse_event(line)
    if not isinstance(event, Hello):
        raise ProtocolError(f"the remote agent did not say hello: {line[:200]!r}")
    return event


def _line(msg: dict[str, object]) -> bytes:
    return json.dumps(msg).encode() + b"\n"
