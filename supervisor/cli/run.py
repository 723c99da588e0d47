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
from supervisor.core.host_url import LOCAL_HOST
from supervisor.jobs.dependencies import with_after
from supervisor.spec.model import load_spec

_USAGE = "supervise run NAME [--host H] [--after JOB] [--gpus 0,1] -- CMD ARGS..."


def cmd_run(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.argv)
    if not argv:
        print(f"supervise run: error: no command to run: `{_USAGE}`", file=sys.stderr)
        return 2
    fields = field_overrides(args)
    path = spec_path(args.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec_text(args.name, argv, args.gpus, _workdir(fields.host, fields.workdir)))
    spec = with_after(load_spec(path).with_overrides({}, fields), args.after)
    return start_spec(spec, {}, args.after, fields, follow=args.follow)


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
