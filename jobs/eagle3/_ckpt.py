"""Training checkpoints: written atomically, checked by checksum, the newest usable one wins.

Layout under the checkpoint root (``{out}/checkpoints``)::

    step_00000200/state.pt     torch.save of the whole training state
    step_00000200/COMPLETE     JSON: step, and size + sha256 of state.pt

A checkpoint is written into ``.tmp-step_{N}-{pid}`` (``state.pt``, fsync, then ``COMPLETE``,
fsync), and that directory is renamed to ``step_{N:08d}``: a ``step_*`` directory is either
complete or was damaged afterwards. Loading walks from the newest to the oldest, and a checkpoint
without its marker, with a size or checksum mismatch, or that torch cannot read is skipped with
one line saying so and renamed to ``unusable-step_{N}`` (left for a post-mortem, never loaded).
Only the newest ``keep`` complete checkpoints are kept; removal renames a
directory to ``.del-*`` before deleting it, and leftovers of both kinds are removed at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._io import fsync_path

MARKER = "COMPLETE"
STATE = "state.pt"
FORMAT = "eagle3-train-checkpoint/1"
_NAME = re.compile(r"^step_(\d+)$")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


class Checkpoints:
    def __init__(self, root: str | os.PathLike[str], keep: int = 3, say: Callable[[str], None] = print):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.keep = keep
        self.say = say

    def clean_leftovers(self) -> list[Path]:
        """Remove temporaries of killed saves and half-removed old checkpoints."""
        removed = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith((".tmp-", ".del-")):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        return removed

    def entries(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every ``step_*`` directory, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = _NAME.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def path(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        import torch

        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-step_{step:08d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            with open(tmp / STATE, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            marker = {"format": FORMAT, "step": step,
                      "files": {STATE: {"size": (tmp / STATE).stat().st_size, "sha256": sha256_file(tmp / STATE)}}}
            with open(tmp / MARKER, "w") as f:
                f.write(json.dumps(marker, indent=1, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            fsync_path(tmp)
            final = self.path(step)
            if final.exists():  # e.g. a damaged checkpoint of this step from an earlier run
                self._remove(final)
            os.rename(tmp, final)
            fsync_path(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return final

    def _remove(self, path: Path) -> None:
        aside = self.root / f".del-{path.name}-{os.getpid()}"
        os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)

    def prune(self) -> None:
        """Keep the newest ``keep`` checkpoints that carry a marker; remove everything older."""
        entries = self.entries()
        marked = [(s, p) for s, p in entries if (p / MARKER).is_file()]
        if len(marked) <= self.keep:
            return
        oldest_kept = marked[-self.keep][0]
        for s, p in entries:
            if s < oldest_kept:
                self._remove(p)

    def problem(self, path: Path) -> str | None:
        """Why the checkpoint at ``path`` cannot be used, or None when its files check out."""
        try:
            marker = json.loads((path / MARKER).read_text())
            expect = marker["files"][STATE]
        except FileNotFoundError:
            return f"no {MARKER} marker"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"unreadable {MARKER} marker ({e.__class__.__name__})"
        state = path / STATE
        try:
            size = state.stat().st_size
        except FileNotFoundError:
            return f"{STATE} is missing"
        if size != expect.get("size"):
            return f"{STATE} has {size} bytes, {expect.get('size')} expected"
        if sha256_file(state) != expect.get("sha256"):
            return f"{STATE} checksum mismatch"
        return None

    def load_latest(self, map_location: Any = "cpu") -> tuple[dict[str, Any], Path] | None:
        """The newest usable checkpoint's state and path; each unusable newer one is reported."""
        import torch

        for _, path in reversed(self.entries()):
            why = self.problem(path)
            if why is None:
                try:
                    state = torch.load(path / STATE, map_location=map_location, weights_only=True)
                    return state, path
                except Exception as e:  # noqa: BLE001 - any load failure makes it unusable
                    why = f"cannot be loaded: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.say(f"train checkpoint {path} is unusable ({why}); falling back to the previous one")
            self._set_aside(path)
        return None

    def _set_aside(self, path: Path) -> None:
        """Rename an unusable checkpoint out of the ``step_*`` namespace (kept for a post-mortem), so
        that it neither shadows the checkpoint written again at its step nor counts for ``keep``."""
        for n in range(1000):
            aside = self.root / f"unusable-{path.name}" if n == 0 else self.root / f"unusable-{path.name}.{n}"
            if not aside.exists():
                os.rename(path, aside)
                return
