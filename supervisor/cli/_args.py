"""What the commands share: argument types checked by argparse (a bad value is a usage error,
exit 2, one line after the usage), times given as `--since`, and the daemon's client."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from supervisor.core.limits import MAX_GRACE_S

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
if TYPE_CHECKING:
    from supervisor.cli.client import Client
    from supervisor.core.overrides import FieldOverrides

N = TypeVar("N", int, float)


def client() -> Client:
    """A client of the running daemon, started when none runs."""
    from supervisor.cli.client import Client  # loaded by the verbs that talk to the daemon only
    from supervisor.core.config import default_paths  # pydantic: not imported by `probe`, which reads a log offline

    c = Client(default_paths())
    c.ensure_daemon()
    return c


def bounded(kind: Callable[[str], N], low: N, high: N, what: str, unit: str = "") -> Callable[[str], N]:
    """An argparse type: ``kind(text)`` from ``low`` to ``high`` (which refuses nan and inf), else a
    usage error in one line, the value cut to 40 characters."""
    def parse(text: str) -> N:
        shown = text[:40]
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {shown!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {_shown(low)} to {_shown(high)}{unit}, got {shown}")
        return value
    return parse


def _shown(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"


# `status -w --every`: a status request each time, so not a busy loop; at least a line a day.
every_seconds = bounded(float, 0.1, 86400.0, "a number of seconds", " seconds")
# `--grace`: as the daemon accepts it (protocol.MAX_GRACE_S).
grace_seconds = bounded(float, 0.0, MAX_GRACE_S, "a number of seconds", " seconds (a day)")
line_count = bounded(int, 1, 1_000_000_000, "a whole number")  # `-n`: lines or events
attempt_number = bounded(int, 1, 2**31 - 1, "an attempt number (1 is the first)")  # `--attempt`: as `attempts` lists them


def grep_pattern(text: str) -> Any:
    """`logs --grep`: an RE2 pattern (the probes' syntax; linear time whatever the log holds), at most
    1,000 characters; a bad one is a usage error in one line."""
    import re2

    from supervisor.probes import re2_options

    if len(text) > 1000:
        raise argparse.ArgumentTypeError(f"a pattern of at most 1,000 characters, got {len(text):,}")
    try:
        return re2.compile(text, options=re2_options(capture=False))
    except re2.error as exc:
        problem = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise argparse.ArgumentTypeError(f"not a valid RE2 pattern {text[:40]!r}: {problem}") from None


def report_out(text: str) -> str:
    """`report --out`: a .png or .html file (the two the report is written as); another name is a
    usage error in one line, before the daemon is asked for anything."""
    if not text.lower().endswith((".png", ".html", ".htm")):
        raise argparse.ArgumentTypeError(f"the report is written as FILE.png or FILE.html, got {text[:80]!r}")
    return text


_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # as a spec's `name` (spec/model.py)


def job_name(text: str) -> str:
    """`run NAME`: a job's name as a spec's `name` takes it; another is a usage error in one line."""
    if not _JOB_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a job name is 1 to 64 letters, digits, '.', '_' and '-', starting with a "
                                         f"letter or digit; got {text[:40]!r}")
    return text


def gpu_list(text: str) -> list[int] | None:
    """`run --gpus`: `0,1` (device indices) or `all` (None: every device, the spec's default)."""
    if text.strip().lower() == "all":
        return None
    try:
        devices = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1 or all, got {text[:40]!r}") from None
    if any(d < 0 or d > 1023 for d in devices) or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices from 0 to 1023, got {text[:40]!r}")
    return devices


def quarantine_place(text: str) -> str:
    """`quarantine --clear`: HOST or HOST:GPU (local, local:1, ssh://box); another is a usage error."""
    if not text.strip() or len(text) > 1000 or any(ord(c) < 32 for c in text):
        raise argparse.ArgumentTypeError(f"expected HOST or HOST:GPU (e.g. local or local:1), got {text[:40]!r}")
    return text.strip()


def whole_number(text: str) -> int:
    """`--shards`: a whole number (its range is the spec's, so `--shards 0` is a spec error, exit 65)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None


def add_field_flags(p: argparse.ArgumentParser) -> None:
    """The spec fields a user may change at start (core/overrides.py); `--set` is for [params] only."""
    p.add_argument("--host", default=None, metavar="HOST", help="run it there: local, ssh://[user@]box[:port], slurm://...")
    p.add_argument("--python", default=None, metavar="PATH", help="the job's interpreter ({python})")
    p.add_argument("--workdir", default=None, metavar="DIR", help="its working directory (absolute on a remote host)")
    p.add_argument("--shards", type=whole_number, default=None, metavar="N",
                   help="run it as N shards at once ({shard}, {num_shards})")


def field_overrides(args: argparse.Namespace) -> FieldOverrides:
    from supervisor.core.overrides import FieldOverrides  # pydantic: see client()

    return FieldOverrides(host=args.host, python=args.python, workdir=args.workdir, shards=args.shards)


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
