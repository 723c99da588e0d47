"""Checkpoint-aware relaunch: which checkpoint an attempt starts from (`{last_checkpoint}`).

`checkpoints = "{out}/step_*"` is a glob on the job's host, relative to its working directory.  The
matches are ordered by the number in their name (`step_10` after `step_9`), then by mtime; with
`checkpoint_complete = "COMPLETE"` only those holding that file count.  An attempt gets the newest
one, except one an earlier attempt of the same run started from and died with before its first
progress (a corrupt or half-written checkpoint fails on loading): the next gets the one before.
Such a failure is not "the same bug twice" while an older checkpoint is left to try.

Listed by one short /bin/sh script: run here for a local host, in the resident shell of an SSH host;
a host with neither (a Slurm host over SSH) lists none and says so once per attempt.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from supervisor.core.errors import HostError, SuperviseError
from supervisor.core.events import Verdict
from supervisor.core.host_url import is_local
from supervisor.hosts.base import Host
from supervisor.spec.model import JobSpec
from supervisor.store.database import AttemptRow

# At most this many matches are looked at: a glob over a huge directory must not flood the loop.
MAX_LISTED = 10_000
_DIGITS = re.compile(r"\d+")
# Verdicts that say an attempt did not fail (a preemption is the scheduler's, not the checkpoint's).
_NOT_FAILURES = frozenset({Verdict.HEALTHY, Verdict.DONE, Verdict.PREEMPTED})

# $1 the glob, $2 the marker ("" none).  IFS empty: the glob is expanded, never split on spaces.  The
# loop uses builtins only; one `stat` dates every complete match (a stat each cost 4 ms over SSH).
# Prints "mtime path" per complete match; a path with a newline in it is left out.
_LIST_SCRIPT = r"""
IFS=''
case "$1" in '~/'*) g="$HOME/${1#??}";; *) g=$1;; esac
if stat -c %.9Y / >/dev/null 2>&1; then f='%.9Y %n'; else f='%Y %n'; fi
n=0
for p in $g; do
  [ -e "$p" ] || continue
  case "$p" in *'
'*) continue;; esac
  if [ -n "$2" ] && [ ! -e "$p/$2" ]; then continue; fi
  n=$((n+1)); [ "$n" -gt MAX_LISTED ] && break
  printf '%s\0' "$p"
done | xargs -0 -r stat -c "$f" -- 2>/dev/null
exit 0
""".replace("MAX_LISTED", str(MAX_LISTED))


@runtime_checkable
class ShellHost(Protocol):
    """A host that runs a short script in its resident shell (the SSH host)."""

    async def run_op(self, body: str, *args: str) -> tuple[int | None, bytes, bytes]: ...


@dataclass(frozen=True)
class Checkpoint:
    path: str
    mtime: float

    def order(self) -> tuple[tuple[int, ...], float, str]:
        """The numbers in its name, as numbers (`step_10` after `step_9`; `epoch_2_step_100` before
        `epoch_3_step_5`), then its mtime, then its name."""
        name = os.path.basename(self.path.rstrip("/")) or self.path
        return tuple(int(d) for d in _DIGITS.findall(name)), self.mtime, name


@dataclass(frozen=True)
class Listing:
    complete: list[Checkpoint]  # oldest first
    note: str = ""  # why none could be listed, when that is so


async def list_complete(host: Host, spec: JobSpec) -> Listing:
    """The complete checkpoints ``spec.checkpoints`` matches on ``host``, oldest first."""
    pattern = spec.checkpoint_glob()
    if not pattern:
        return Listing([])
    if not os.path.isabs(pattern) and not pattern.startswith("~"):
        pattern = os.path.join(spec.resolved_workdir(), pattern)
    marker = spec.checkpoint_complete
    try:
        if isinstance(host, ShellHost):
            found = await _listed(host, pattern, marker)
        elif is_local(host.name):
            found = await _listed(_ThisMachine(), pattern, marker)
        else:
            return Listing([], f"checkpoints are not listed on {host.name}: {{last_checkpoint}} is empty")
    except (TimeoutError, SuperviseError, OSError) as exc:
        raise HostError(f"{host.name}: the checkpoints {pattern} could not be listed: {exc}") from exc
    return Listing(found)


def _parsed(out: bytes) -> list[Checkpoint]:
    """The script's "mtime path" lines, oldest first."""
    found = []
    for line in out.decode(errors="replace").splitlines():
        mtime, _, path = line.partition(" ")
        try:
            stamp = float(mtime)
        except ValueError:
            continue
        if path:
            found.append(Checkpoint(path, stamp))
    return sorted(found, key=Checkpoint.order)


class _ThisMachine:
    """This machine's /bin/sh, run as the SSH host's resident shell runs the script: one glob rule
    everywhere, and no Python loop over 10,000 paths holding the GIL the daemon's loop needs."""

    async def run_op(self, body: str, *args: str) -> tuple[int | None, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", body, "sh", *args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode, out, err


async def _listed(host: ShellHost, pattern: str, marker: str) -> list[Checkpoint]:
    _, out, _ = await host.run_op(_LIST_SCRIPT, pattern, marker)
    # 10,000 lines take ~0.2 s to read and order under load: a thread, the loop gets its turns meanwhile.
    return await asyncio.to_thread(_parsed, out)


def is_failure(verdict: Verdict | None) -> bool:
    """Whether an attempt judged ``verdict`` failed (on its checkpoint, if it failed before progress)."""
    return verdict is not None and verdict not in _NOT_FAILURES


def failed_to_load(rows: list[AttemptRow]) -> set[str]:
    """The checkpoints attempts of ``rows`` started from and failed with before any progress."""
    return {row.checkpoint for row in rows if row.checkpoint and is_failure(row.verdict) and row.progress is None}


def choose(listing: Listing, bad: set[str]) -> str:
    """The newest complete checkpoint not in ``bad``; "" when none is left."""
    for checkpoint in reversed(listing.complete):
        if checkpoint.path not in bad:
            return checkpoint.path
    return ""
