"""The supervisor's exception tree, and the one table that carries it across the API.

Every error the supervisor raises on purpose derives from ``SuperviseError``; the CLI
catches only that base class and prints its one-line message.  Low-level errors
(OSError, sqlite3.Error, pydantic.ValidationError, asyncssh errors, ...) are translated
where they enter, with ``raise X from exc`` so the cause stays in tracebacks.

    SuperviseError
    ├── ConfigError            bad configuration or environment (e.g. a clashing `supervisor` package)
    ├── SpecError              a job spec that does not validate (file, field, what was expected)
    ├── ProbePackError         a probe pack that does not load (file, probe id, problem)
    ├── StoreError             the SQLite store cannot be opened or written
    │   └── StoreBusy          another process holds the store's lock (a `sqlite3` shell, a backup)
    ├── FileWriteError         a file the CLI writes (`report --out`) cannot be written
    ├── HostError              a host cannot launch, follow, signal or inspect
    │   ├── LaunchError        the wrapper did not start the command
    │   ├── ConnectionLost     a remote host's connection dropped (retried by the caller)
    │   └── HostRefused        the box answered and refused: its host key, or our login (not retried)
    ├── DaemonError            talking to the daemon failed
    │   ├── DaemonNotRunning   no daemon answers on the socket
    │   ├── RequestRejected    the daemon refused the request itself (carries its status code)
    │   └── InternalError      a bug in the daemon (its log has the traceback)
    │       └── TransitionRefused  a write that would take an attempt out of its stored end
    ├── NotFound               an unknown job or attempt
    └── AlreadyRunning         `start` of a job that is running (or waiting to relaunch)

The border: the daemon answers an error with its ``ErrorKind`` (and exit code) in the
``ErrorBody``; the client raises the class ``TABLE`` pairs with that kind.  So an error the
daemon finds reaches the CLI as the same class and exit code as if the CLI had found it
(httpx's exception mapping, read both ways).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SuperviseError(Exception):
    """Base of every error the supervisor raises on purpose; its str() is one line for humans."""

    exit_code = 1


class ConfigError(SuperviseError):
    exit_code = 78  # EX_CONFIG


class SpecError(SuperviseError):
    exit_code = 65  # EX_DATAERR


class ProbePackError(SuperviseError):
    exit_code = 65


class StoreError(SuperviseError):
    exit_code = 74  # EX_IOERR


class StoreBusy(StoreError):
    """Another process holds the store's lock: the daemon does not wait on it (its loop would
    stop), it says so.  Still 74: the store cannot be written, for now; nothing stored is lost."""


class FileWriteError(SuperviseError):
    """A file the CLI was asked to write (`report --out`) cannot be written."""

    exit_code = 74  # EX_IOERR, as for the store


class HostError(SuperviseError):
    exit_code = 69  # EX_UNAVAILABLE


class LaunchError(HostError):
    pass


class ConnectionLost(HostError):
    pass


class HostRefused(HostError):
    """The host answered and refused us: its key is not the known one, or our login.  Retrying
    will not cure it, but a process already running there runs on: an attempt is not ended by it."""


class DaemonError(SuperviseError):
    exit_code = 69


class DaemonNotRunning(DaemonError):
    pass


class RequestRejected(DaemonError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class InternalError(DaemonError):
    exit_code = 70  # EX_SOFTWARE


class TransitionRefused(InternalError):
    """A write that would take an attempt out of an end already stored (ended, stopped): a defect
    in its writer, never the user's doing; what is stored stays as it was."""


class NotFound(SuperviseError):
    exit_code = 66  # EX_NOINPUT


class AlreadyRunning(SuperviseError):
    exit_code = 75  # EX_TEMPFAIL: it can be started again once it has ended or been stopped


class ErrorKind(StrEnum):
    """What went wrong, as the API names it (``ErrorBody.kind``)."""

    FAILED = "failed"
    CONFIG = "config"
    SPEC = "spec"
    PROBE_PACK = "probe_pack"
    STORE = "store"
    STORE_BUSY = "store_busy"
    FILE_WRITE = "file_write"
    HOST = "host"
    LAUNCH = "launch"
    CONNECTION_LOST = "connection_lost"
    DAEMON = "daemon"
    DAEMON_NOT_RUNNING = "daemon_not_running"
    REJECTED = "rejected"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    ALREADY_RUNNING = "already_running"


@dataclass(frozen=True)
class ErrorRow:
    kind: ErrorKind
    cls: type[SuperviseError]
    status: int  # the HTTP status the daemon answers with


TABLE: tuple[ErrorRow, ...] = (
    ErrorRow(ErrorKind.FAILED, SuperviseError, 500),
    ErrorRow(ErrorKind.CONFIG, ConfigError, 500),
    ErrorRow(ErrorKind.SPEC, SpecError, 422),
    ErrorRow(ErrorKind.PROBE_PACK, ProbePackError, 422),
    ErrorRow(ErrorKind.STORE, StoreError, 507),
    ErrorRow(ErrorKind.STORE_BUSY, StoreBusy, 503),
    ErrorRow(ErrorKind.FILE_WRITE, FileWriteError, 507),
    ErrorRow(ErrorKind.HOST, HostError, 502),
    ErrorRow(ErrorKind.LAUNCH, LaunchError, 502),
    ErrorRow(ErrorKind.CONNECTION_LOST, ConnectionLost, 504),
    ErrorRow(ErrorKind.DAEMON, DaemonError, 503),
    ErrorRow(ErrorKind.DAEMON_NOT_RUNNING, DaemonNotRunning, 503),
    ErrorRow(ErrorKind.REJECTED, RequestRejected, 400),
    ErrorRow(ErrorKind.INTERNAL, InternalError, 500),
    ErrorRow(ErrorKind.NOT_FOUND, NotFound, 404),
    ErrorRow(ErrorKind.ALREADY_RUNNING, AlreadyRunning, 409),
)
_BY_KIND = {row.kind: row for row in TABLE}
_BY_CLASS = {row.cls: row for row in TABLE}


def row_of(exc: SuperviseError) -> ErrorRow:
    """The table's row for ``exc``: its own class's, else its nearest listed base's."""
    for cls in type(exc).__mro__:
        row = _BY_CLASS.get(cls)
        if row is not None:
            return row
    raise AssertionError("SuperviseError is in the table")  # pragma: no cover


def http_status(exc: SuperviseError) -> int:
    return exc.status if isinstance(exc, RequestRejected) else row_of(exc).status


def error_of(kind: ErrorKind, message: str, status: int) -> SuperviseError:
    """The exception the table pairs with ``kind``, carrying the daemon's message."""
    cls = _BY_KIND[kind].cls
    return RequestRejected(message, status) if cls is RequestRejected else cls(message)


# Error messages echo what the user wrote so they can find it, but an input may be megabytes
# long or hold newlines: an echoed value is cut to this many characters, and a message is one line.
ECHO_LIMIT = 120


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """A user-supplied value as an error message quotes it: repr (control characters escaped), cut."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str, limit: int = 2 * ECHO_LIMIT) -> str:
    """``text`` with every run of whitespace (newlines included) made one space, cut to ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
