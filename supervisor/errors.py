"""The supervisor's exception tree.

Every error the supervisor raises on purpose derives from ``SuperviseError``; the CLI
catches only that base class and prints its one-line message.  Low-level errors
(OSError, sqlite3.Error, pydantic.ValidationError, asyncssh errors, ...) are translated
where they enter, with ``raise X from exc`` so the cause stays in tracebacks.

    SuperviseError
    ├── ConfigError            bad configuration or environment (e.g. a clashing `supervisor` package)
    ├── SpecError              a job spec that does not validate (file, field, what was expected)
    ├── ProbePackError         a probe pack that does not load (file, probe id, problem)
    ├── StoreError             the SQLite store cannot be opened or written
    ├── HostError              a host cannot launch, follow, signal or inspect
    │   ├── LaunchError        the wrapper did not start the command
    │   └── ConnectionLost     a remote host's connection dropped (retried by the caller)
    ├── DaemonError            talking to the daemon failed
    │   ├── DaemonNotRunning   no daemon answers on the socket
    │   └── RequestRejected    the daemon answered with an error (carries its status code)
    └── NotFound               an unknown job or attempt
"""

from __future__ import annotations


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


class HostError(SuperviseError):
    exit_code = 69  # EX_UNAVAILABLE


class LaunchError(HostError):
    pass


class ConnectionLost(HostError):
    pass


class DaemonError(SuperviseError):
    exit_code = 69


class DaemonNotRunning(DaemonError):
    pass


class RequestRejected(DaemonError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class NotFound(SuperviseError):
    exit_code = 66  # EX_NOINPUT


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
