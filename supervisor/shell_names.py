"""Job names for shell completion: `supervise jobs --names [--specs]`, run by the shell on every Tab.

It must answer at once and change nothing.  So it never starts a daemon (a Tab that spawned one would leave a
process behind in whatever state directory the environment names), asks a running one over its socket with a
short timeout, and is built from the standard library alone: the console script routes the request here before
the CLI (argparse, the HTTP client, pydantic settings) is imported.  Every name printed is a valid job name, so a
shell's `compgen -W` never meets a word it would expand.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys

from supervisor.core.errors import SuperviseError
from supervisor.core.paths import Paths, default_paths
from supervisor.spec.search import JOB_NAME, spec_names

# A Tab waits on this: a daemon busy for longer gives no names this time rather than a frozen prompt.
_ASK_TIMEOUT_S = 1.0
_PATH = "/v1/job-names"
_FLAGS = frozenset({"--names", "--specs"})


def is_names_request(argv: list[str]) -> bool:
    """Whether `argv` (after the program name) is `jobs` with only --names and/or --specs."""
    return len(argv) >= 2 and argv[0] == "jobs" and set(argv[1:]) <= _FLAGS


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("supervise", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def daemon_job_names(paths: Paths, timeout_s: float = _ASK_TIMEOUT_S) -> list[str]:
    """The running daemon's job names; none when no daemon answers in time, or its answer is not one."""
    if not paths.socket.exists():
        return []
    conn = _UnixHTTPConnection(str(paths.socket), timeout_s)
    try:
        conn.request("GET", _PATH)
        response = conn.getresponse()
        if response.status != 200:
            return []
        body = json.loads(response.read(1 << 22))
    except (OSError, http.client.HTTPException, ValueError):
        return []
    finally:
        conn.close()
    names = body.get("names") if isinstance(body, dict) else None
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and JOB_NAME.fullmatch(n)]


def print_names(known: bool, specs: bool) -> int:
    """Print, one a line, the daemon's job names (with ``known``) and the specs `start` finds (with ``specs``)."""
    names: set[str] = set()
    if known:
        try:
            names |= set(daemon_job_names(default_paths()))
        except SuperviseError:
            pass  # a state directory the socket cannot live in: nothing to complete from it
    if specs:
        names |= spec_names()
    for name in sorted(names):
        sys.stdout.write(name + "\n")
    return 0


def main(argv: list[str]) -> int:
    flags = set(argv[1:])
    return print_names("--names" in flags, "--specs" in flags)
