"""A minimal inotify binding (ctypes on libc) and a per-event-loop watch hub.

Only what the log follower needs: create a non-blocking instance, add and remove watches,
read and parse events.  ``WatchHub`` shares one inotify instance among all followers of an
event loop, because instances are a small per-user quota (``fs.inotify.max_user_instances``,
128 by default, shared with every other program of that user) while watches are plentiful.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import itertools
import os
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_MASK_ADD = 0x20000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of NUL-padded name)
_READ_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    wd: int
    mask: int
    cookie: int
    name: bytes


def parse_events(buf: bytes) -> list[InotifyEvent]:
    return [InotifyEvent(*fields) for fields in _parse_raw(buf)]


def _parse_raw(buf: bytes) -> list[tuple[int, int, int, bytes]]:
    raw: list[tuple[int, int, int, bytes]] = []
    pos = 0
    size = _EVENT_HEADER.size
    unpack = _EVENT_HEADER.unpack_from
    while pos + size <= len(buf):
        wd, mask, cookie, length = unpack(buf, pos)
        start = pos + size
        raw.append((wd, mask, cookie, buf[start : start + length].rstrip(b"\0") if length else b""))
        pos = start + length
    return raw


class _Libc:
    """The three libc entry points, resolved once; raises OSError when they are missing."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            self.init1 = lib.inotify_init1
            self.add_watch = lib.inotify_add_watch
            self.rm_watch = lib.inotify_rm_watch
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"inotify is not available: {exc}") from exc
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm_watch.restype = ctypes.c_int


_libc: _Libc | None = None


def _lib() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class Inotify:
    """One inotify instance (a non-blocking, close-on-exec file descriptor)."""

    def __init__(self) -> None:
        self.fd = _check(_lib().init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")

    def add_watch(self, path: str | os.PathLike[str], mask: int) -> int:
        return _check(_lib().add_watch(self.fd, os.fsencode(path), mask), f"inotify_add_watch {path}")

    def rm_watch(self, wd: int) -> None:
        # EINVAL: the kernel already dropped the watch (its file was deleted); nothing to do.
        if _lib().rm_watch(self.fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_rm_watch: {os.strerror(code)}")

    def read_events(self) -> list[InotifyEvent]:
        """The events queued, each distinct one once (in order of its first occurrence).

        Busy logs written in turn queue one IN_MODIFY per write, which the kernel merges only
        when the same event is queued twice in a row; every subscriber treats a repeat as a
        no-op (it only says "look again"), so repeats are dropped before any object is made.
        """
        raw: list[tuple[int, int, int, bytes]] = []
        while True:
            try:
                buf = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not buf:
                break
            raw += _parse_raw(buf)
        return [InotifyEvent(*fields) for fields in dict.fromkeys(raw)]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


Callback = Callable[[InotifyEvent], None]


@dataclass(frozen=True, slots=True)
class Watch:
    """A subscription handle returned by ``WatchHub.add``."""

    wd: int
    token: int


_STORM_GAP_S = 0.002  # inotify readings closer together than this are a storm of writes
_STORM_PAUSE_S = 0.005  # how long a storm pauses reading: the latency it may add


class WatchHub:
    """One inotify instance per event loop, its fd registered with ``loop.add_reader``.

    Several subscribers may watch the same inode (the kernel then returns the same watch
    descriptor), so subscriptions are kept per descriptor and the kernel watch is removed
    only when its last subscriber leaves.  The hub closes itself when it has none left.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inotify = Inotify()
        self._subs: dict[int, dict[int, Callback]] = {}
        self._tokens = itertools.count()
        self._last_read = 0.0
        try:
            loop.add_reader(self._inotify.fd, self._on_readable)
        except NotImplementedError as exc:  # an event loop without readiness callbacks
            self._inotify.close()
            raise OSError(errno.ENOSYS, "this event loop cannot watch file descriptors") from exc

    def add(self, path: str | os.PathLike[str], mask: int, callback: Callback) -> Watch:
        # IN_MASK_ADD: never narrow what another subscriber of the same inode asked for.
        wd = self._inotify.add_watch(path, mask | IN_MASK_ADD)
        token = next(self._tokens)
        self._subs.setdefault(wd, {})[token] = callback
        return Watch(wd, token)

    def remove(self, watch: Watch) -> None:
        subs = self._subs.get(watch.wd)
        if subs is None or subs.pop(watch.token, None) is None:
            return
        if not subs:
            del self._subs[watch.wd]
            self._inotify.rm_watch(watch.wd)
        if not self._subs:
            self._close()

    def release_if_idle(self) -> None:
        if not self._subs:
            self._close()

    def _on_readable(self) -> None:
        now = time.monotonic()
        for event in self._inotify.read_events():
            self._dispatch(event)
        if now - self._last_read < _STORM_GAP_S and self._inotify.fd >= 0:
            # A storm of writes (busy logs): stop reading for a moment.  Events queue up
            # meanwhile (the kernel merges repeats of one watch), and one wake-up of the loop
            # and of each follower then stands for many writes.  Quiet logs never pause.
            self._loop.remove_reader(self._inotify.fd)
            self._loop.call_later(_STORM_PAUSE_S, self._resume)
        self._last_read = now

    def _resume(self) -> None:
        if self._inotify.fd >= 0 and _hubs.get(self._loop) is self:
            self._loop.add_reader(self._inotify.fd, self._on_readable)

    def _dispatch(self, event: InotifyEvent) -> None:
        if event.mask & IN_Q_OVERFLOW:
            # Events were lost: every subscriber must re-check its file.
            targets = [cb for subs in self._subs.values() for cb in subs.values()]
        else:
            targets = list(self._subs.get(event.wd, {}).values())
        if event.mask & IN_IGNORED:
            self._subs.pop(event.wd, None)  # the kernel removed this watch
        for callback in targets:
            callback(event)

    def _close(self) -> None:
        if _hubs.get(self._loop) is self:
            del _hubs[self._loop]
        if self._inotify.fd >= 0:
            self._loop.remove_reader(self._inotify.fd)
        self._inotify.close()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WatchHub] = weakref.WeakKeyDictionary()


def hub_for(loop: asyncio.AbstractEventLoop) -> WatchHub:
    """The loop's shared hub, created on first use; raises OSError if inotify is unavailable."""
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = WatchHub(loop)
    return hub
