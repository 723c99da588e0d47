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


# What people pass to `start` when they mean "run this": a script of a language, or an executable file.
_PROGRAM_SUFFIXES = frozenset({".py", ".sh", ".bash", ".zsh", ".pl", ".rb", ".js", ".jl", ".R", ".lua"})


def program_not_spec(name_or_path: str) -> str | None:
    """The one line that says what to do when `start` was given a program instead of a job spec
    (a Python script by name, a shell script by its path); None for anything else.  A .toml file is a spec whatever
    it holds; so is a file without a program's suffix that is not executable and has no `#!`."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            shebang = handle.read(2) == b"#!"
    except OSError:
        return None
    if path.suffix not in _PROGRAM_SUFFIXES and not shebang and not os.access(path, os.X_OK):
        return None
    command = f"python {name_or_path}" if path.suffix == ".py" and not shebang else (
        name_or_path if os.sep in name_or_path else f"./{name_or_path}")
    return (f"{name_or_path} is a program, not a job spec (.toml); to supervise it without writing one: "
            f"`supervise run {_name_for(path)} -- {command}`")


def _name_for(path: Path) -> str:
    """A job name made from a program's file name (`train.py` -> `train`), or NAME where none fits."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip("-_.")[:64]
    return stem if JOB_NAME.fullmatch(stem) else "NAME"
