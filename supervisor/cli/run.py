"""`supervise run NAME [--host H] [--after JOB] [--gpus LIST] [--follow] -- CMD ARGS...`: a job
without a spec file of the user's (pueue's `add`).

The command line becomes a spec written into the daemon's state directory (`run/NAME.toml`), which
is then started exactly as `start FILE` starts one: the same checks, the default probe packs (every
pack found reads the log), the same judgement and relaunches; `restart`, `restart --reload`,
`status` and the rest treat it as any job.  Its arguments are taken literally: a `{` in one is not
a template (it is written as `{{`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from supervisor.cli._args import field_overrides
from supervisor.cli.jobs import start_spec
from supervisor.core.config import default_paths
from supervisor.core.errors import SuperviseError
from supervisor.core.host_url import LOCAL_HOST
from supervisor.jobs.dependencies import with_after
from supervisor.spec.model import load_spec

_USAGE = "supervise run NAME [--host H] [--after JOB] [--gpus 0,1] -- CMD ARGS..."


def cmd_run(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.argv)
    if args.stray:
        # `run NAME extra -- CMD`: the word is neither run's nor the command's; dropped, it would
        # never run and nothing would say so.
        print(f"supervise run: error: unexpected {' '.join(args.stray)!r} before `--` (the command and all its "
              f"arguments go after it): `{_USAGE}`", file=sys.stderr)
        return 2
    if not argv:
        print(f"supervise run: error: no command to run: `{_USAGE}`", file=sys.stderr)
        return 2
    fields = field_overrides(args)
    path = spec_path(args.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The daemon reads the spec from its file, so the file is written first; a start refused (the job
    # already running, a command not found) puts back what was there.  Otherwise the running job's file
    # would hold a command that never ran, which `restart` reports as an edit and `--reload` would take.
    before = path.read_text() if path.exists() else None
    path.write_text(spec_text(args.name, argv, args.gpus, _workdir(fields.host, fields.workdir)))
    taken = False

    def accepted() -> None:
        nonlocal taken
        taken = True

    try:
        spec = with_after(load_spec(path).with_overrides({}, fields), args.after)
        return start_spec(spec, {}, args.after, fields, follow=args.follow, accepted=accepted)
    except SuperviseError:
        if not taken:
            _put_back(path, before)
        raise


def _put_back(path: Path, text: str | None) -> None:
    """The run file as it was before a refused `run`: its earlier text, or none."""
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


def spec_path(name: str) -> Path:
    """Where `run NAME` writes its spec: the state directory, never the user's working directory."""
    return default_paths().state_dir / "run" / f"{name}.toml"


def spec_text(name: str, argv: list[str], gpus: list[int] | None, workdir: str | None) -> str:
    """The spec of a command line, as TOML (its strings as JSON writes them, which TOML reads)."""
    literal = [item.replace("{", "{{").replace("}", "}}") for item in argv]
    lines = [f"# written by `supervise run {name}`: `supervise run {name} -- ...` again rewrites it",
             f"name = {json.dumps(name)}", f"command = {json.dumps(literal)}"]
    if workdir is not None:
        lines.append(f"workdir = {json.dumps(workdir)}")
    if gpus is not None:
        lines += ["[gpu]", f"devices = {json.dumps(gpus)}"]
    return "\n".join(lines) + "\n"


def _workdir(host: str | None, given: str | None) -> str | None:
    """A local job runs where `run` was typed (as a shell would), unless --workdir says otherwise; a
    remote one where --workdir says, else where its host starts it."""
    if given is not None or host not in (None, "", LOCAL_HOST):
        return None  # --workdir is applied as the field flag it is
    return os.getcwd()
