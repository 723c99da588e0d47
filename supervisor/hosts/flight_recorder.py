"""PyTorch's flight recorder for a torch distributed attempt: set up at launch, dumped before a kill.

A collective that hangs leaves every rank's Python stack in the same ``wait()``: which rank never
entered which collective is what the flight recorder (``torch.distributed``'s ring of the last
collectives each rank scheduled, pytorch PR #123023) says.  Each attempt of a local job that runs
torch distributed gets, beside its log, a folder ``<log>.fr/`` and in its environment:

- ``TORCH_FR_BUFFER_SIZE``: how many collectives each rank keeps (torch's own default, 2000,
  unless the spec's ``env`` says otherwise);
- ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` and ``TORCH_FR_DUMP_TEMP_FILE``: the dump file's stem, each
  rank writing ``<stem><rank>`` (the first name is the NCCL process group's, the second newer
  torch's);
- ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: each NCCL rank opens the FIFO ``<stem><rank>.pipe`` and dumps
  when anything is written to it (its heartbeat monitor thread polls the pipe).

At a hang verdict, beside the py-spy stacks, ``collect`` writes to every pipe, waits a bounded
time for the dumps, reads them (a pickle of plain lists, dicts and scalars, unpickled with every
class refused and each file's size bounded) and says which rank is behind on which collective.
A gloo process group records into the flight recorder too but opens no pipe: its ranks' dumps
are collected only where the job itself writes them (or NCCL's watchdog did, at its own timeout).
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import pickle
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEM = "rank_"  # each rank's dump is <folder>/rank_<global rank>, its pipe rank_<rank>.pipe
BUFFER_SIZE = "2000"  # torch's own default: the ring is on as torch ships it, at the size it ships
# How long the dumps may take to appear, within the stacks' own bound before a kill (py-spy's, taken
# meanwhile): a rank's first dump loads torch's symboliser, 7-8 s on a loaded 2-core CPU (RESULTS §38).
WAIT_S = 8.0
SETTLE_S = 0.3  # a dump file unchanged this long is taken as written
MAX_DUMP_BYTES = 32 * 1024 * 1024  # per rank: a bigger file is listed, not read
MAX_RANKS = 256  # ranks read for the summary (the folder may hold more; all are listed by count)
MAX_SUMMARY_CHARS = 1200
_RANK_FILE = re.compile(r"rank_(\d+)")

# How a command is recognised as torch distributed: its launchers, run as a program or a module.
_LAUNCHERS = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch"})

ENV_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE",
             "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")


def runs_torch_distributed(argv: Sequence[str]) -> bool:
    """Whether a command launches torch distributed ranks: torchrun, or ``python -m
    torch.distributed.run`` (or ``.launch``), anywhere in its argv (``uv run torchrun ...``)."""
    for i, item in enumerate(argv):
        if os.path.basename(item) in _LAUNCHERS:
            return True
        if item == "-m" and i + 1 < len(argv) and argv[i + 1] in _LAUNCHERS:
            return True
    return False


def folder_for(log_path: str) -> Path:
    """Where an attempt's dumps go: beside its log, named after it."""
    return Path(log_path + ".fr")


def environment(folder: Path, spec_env: Mapping[str, str]) -> dict[str, str]:
    """The attempt's environment's additions: none that the spec's own ``env`` sets already."""
    stem = str(folder / STEM)
    wanted = {"TORCH_FR_BUFFER_SIZE": BUFFER_SIZE, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem,
              "TORCH_FR_DUMP_TEMP_FILE": stem, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem}
    return {k: v for k, v in wanted.items() if k not in spec_env}


@dataclass(frozen=True, slots=True)
class RankTrace:
    """One rank's last collective, per its dump."""

    rank: int
    entries: int
    last_seq: int  # the highest collective_seq_id it scheduled (0: none)
    last_name: str  # that collective's profiling name ("nccl:all_reduce")
    last_state: str  # "scheduled", "started", "completed"
    error: str = ""  # why its dump could not be read


@dataclass(frozen=True, slots=True)
class FlightRecord:
    """What the flight recorder said before a kill: each rank's dump file and one summary line."""

    summary: str
    dumps: tuple[str, ...] = ()


class _PlainOnly(pickle.Unpickler):
    """A flight recorder dump holds lists, dicts, tuples and scalars only: any class is refused,
    so a file that is not one runs nothing."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight recorder dump holds no objects")


def read_rank(path: Path, rank: int) -> RankTrace:
    """One rank's dump, read (bounded) and reduced to its last collective."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            return RankTrace(rank, 0, 0, "", "", f"{size} bytes, more than the {MAX_DUMP_BYTES} read")
        data = _PlainOnly(io.BytesIO(path.read_bytes())).load()
    except Exception as exc:  # noqa: BLE001 - the job's file: whatever it holds is one line, never a failed kill
        return RankTrace(rank, 0, 0, "", "", f"unreadable: {exc}"[:200])
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return RankTrace(rank, 0, 0, "", "", "no entries")
    last: dict[str, Any] | None = None
    for entry in entries:
        collective = isinstance(entry, dict) and not entry.get("is_p2p") \
            and isinstance(entry.get("collective_seq_id"), int)
        if collective and (last is None or entry["collective_seq_id"] >= last["collective_seq_id"]):
            last = entry
    if last is None:
        return RankTrace(rank, len(entries), 0, "", "")
    return RankTrace(rank, len(entries), last["collective_seq_id"], str(last.get("profiling_name") or "?"),
                     str(last.get("state") or "?"))


def summarise(traces: Sequence[RankTrace], ranks_found: int) -> str:
    """One line: which ranks are behind on which collective, and where the others wait."""
    read = [t for t in traces if not t.error]
    parts: list[str] = []
    if read:
        ahead = max(t.last_seq for t in read)
        lead = next(t for t in read if t.last_seq == ahead)
        behind = [t for t in read if t.last_seq < ahead]
        if behind:
            named = ", ".join(f"rank {t.rank} (last #{t.last_seq}{' ' + t.last_name if t.last_name else ''})"
                              for t in behind[:8])
            parts.append(f"behind: {named}{' and more' if len(behind) > 8 else ''}; "
                         f"never entered #{ahead} {lead.last_name}")
            waiting = [t.rank for t in read if t.last_seq == ahead]
            parts.append(f"rank{'s' if len(waiting) > 1 else ''} {_ranks(waiting)} in #{ahead} {lead.last_name} "
                         f"({lead.last_state})")
        else:
            states = sorted({t.last_state for t in read})
            parts.append(f"all {len(read)} ranks at #{ahead} {lead.last_name} ({'/'.join(states)})"
                         if ahead else f"no collective recorded on {len(read)} rank{'s' if len(read) > 1 else ''}")
    for t in traces:
        if t.error:
            parts.append(f"rank {t.rank}: {t.error}")
    if ranks_found > len(traces):
        parts.append(f"{len(traces)} of {ranks_found} ranks read")
    return ("flight recorder: " + "; ".join(parts))[:MAX_SUMMARY_CHARS]


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _trigger(folder: Path) -> int:
    """Write to every rank's pipe (never blocking: a pipe no rank reads any more is skipped)."""
    poked = 0
    for pipe in folder.glob(f"{STEM}*.pipe"):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENOENT):  # its rank has ended, or never opened it
                continue
            continue
        try:
            os.write(fd, b"1\n")
            poked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return poked


def _dumps(folder: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    try:
        for path in folder.iterdir():
            match = _RANK_FILE.fullmatch(path.name)
            if match and path.is_file():
                found[int(match.group(1))] = path
    except OSError:
        pass
    return found


def _sizes(found: Mapping[int, Path]) -> dict[int, tuple[int, float]]:
    sizes: dict[int, tuple[int, float]] = {}
    for rank, path in found.items():
        try:
            st = path.stat()
        except OSError:
            continue
        sizes[rank] = (st.st_size, st.st_mtime)
    return sizes


async def collect(folder: Path, wait_s: float = WAIT_S) -> FlightRecord | None:
    """The ranks' dumps, asked for through their pipes and read: None where the attempt has no
    flight recorder folder (not a torch distributed job).  Never longer than about ``wait_s``."""
    if not await asyncio.to_thread(folder.is_dir):
        return None
    asked_at = time.time()
    poked = await asyncio.to_thread(_trigger, folder)
    deadline = time.monotonic() + wait_s
    previous: dict[int, tuple[int, float]] = {}
    stable_since = time.monotonic()
    while True:
        found = await asyncio.to_thread(_dumps, folder)
        sizes = await asyncio.to_thread(_sizes, found)
        fresh = [r for r, (_, mtime) in sizes.items() if mtime >= asked_at - 1]
        if sizes != previous:
            previous, stable_since = sizes, time.monotonic()
        settled = time.monotonic() - stable_since >= SETTLE_S
        if settled and (len(fresh) >= poked or not poked) and (found or not poked):
            break
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    if not found:
        said = (f"asked {poked} rank{'s' if poked != 1 else ''} through the pipe, no dump within {wait_s:.0f} s"
                if poked else "no rank opened the dump pipe (the NCCL process group opens it; gloo does not)")
        return FlightRecord(f"flight recorder: {said}")
    ranks = sorted(found)[:MAX_RANKS]
    traces = await asyncio.to_thread(lambda: [read_rank(found[r], r) for r in ranks])
    return FlightRecord(summarise(traces, len(found)), tuple(str(found[r]) for r in ranks))
