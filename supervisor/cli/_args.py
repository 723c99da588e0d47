"""What the commands share: argument types checked by argparse (a bad value is a usage error,
exit 2, one line after the usage), times given as `--since`, and the daemon's client."""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime

from ..client import Client
from ..config import default_paths
from ..protocol import MAX_GRACE_S

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def client() -> Client:
    """A client of the running daemon, started when none runs."""
    c = Client(default_paths())
    c.ensure_daemon()
    return c


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def grace_seconds(text: str) -> float:
    """`--grace`: finite, from 0 to a day (protocol.MAX_GRACE_S), as the daemon accepts it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text[:40]!r}") from None
    if not 0 <= value <= MAX_GRACE_S:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_GRACE_S:g} seconds (a day), got {text[:40]}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def since_time(text: str, now: float | None = None) -> float:
    """`10m`, `2h`, `90s`, `1d` ago, or a local time: `2025-05-01 14:00[:00]`, `14:00` (today)."""
    now = time.time() if now is None else now
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text.strip()):
            today = datetime.fromtimestamp(now).date().isoformat()
            return datetime.fromisoformat(f"{today} {text.strip()}").timestamp()
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration (10m, 2h, 30s, 1d) or a time (14:00, 2025-05-01 14:00), got {text!r}") from None


def add_since(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--since", type=since_time, default=None, metavar="WHEN",
                        help=f"only {what}: a duration ago (10m, 2h) or a time (14:00, 2025-05-01 14:00)")
