"""Where `supervise start NAME` finds NAME.toml, and what a job's name may be.

Standard library only: shell completion lists these names on every Tab (supervisor/shell_names.py) and must not
load the spec model to do it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from supervisor.resources import jobs_dir

# A job name becomes a directory name (its logs) and a word a shell completes: fullmatch, so a trailing newline
# is refused too, and nothing a shell would expand ($, `, quotes, spaces) can be in one.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def spec_search_path() -> list[Path]:
    """Where `supervise start NAME` looks for NAME.toml: $SUPERVISE_JOBS_PATH, ./jobs, the built-in jobs."""
    dirs = [Path(p) for p in os.environ.get("SUPERVISE_JOBS_PATH", "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "jobs")
    dirs.append(jobs_dir())
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def spec_names() -> set[str]:
    """The names of the job specs `start` finds by name: files NAME.toml whose NAME is a valid job name (a file
    named `$(cmd).toml` is not a job `start` could run, and must not reach a shell's completion as a word)."""
    names: set[str] = set()
    for directory in spec_search_path():
        if directory.is_dir():
            names |= {path.stem for path in directory.glob("*.toml") if JOB_NAME.fullmatch(path.stem)}
    return names
