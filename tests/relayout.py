"""Move supervisor/'s flat modules into layer packages, and rewrite every reference to them.

Re-runnable: run it on a tree where some or all of the moves are done and it finishes the rest.
Every import, mock target, `python -m` line and path in the repository's tracked text files is
rewritten, so a branch written against the flat layout can be merged and this run again on top.

    python tests/relayout.py            # from the repository root

It lives under tests/ because the top level holds only what the project is (pyproject.toml,
supervisor/, jobs/, probes/, tests/, deploy/, README.md, docs/): it is a maintenance script the
layout test and the docs check verify the result of, not a part of the shipped package.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "supervisor"

# old module (or package) -> new module (or package).  One layer per package.
MOVES: dict[str, str] = {
    # core: the vocabulary every layer speaks
    "_format": "core.formatting",
    "errors": "core.errors",
    "events": "core.events",
    "protocol": "core.protocol",
    "records": "core.records",
    "filemodes": "core.filemodes",
    "textfile": "core.textfile",
    "tasks": "core.tasks",
    "bus": "core.bus",
    "backoff": "core.backoff",
    "config": "core.config",
    # spec: what a job is
    "spec": "spec.model",
    "spec_fields": "spec.fields",
    "spec_notes": "spec.notes",
    "spec_tables": "spec.tables",
    "command_check": "spec.command_check",
    "pipeline": "spec.pipeline",
    # store: what is kept
    "store": "store.database",
    "store_schema": "store.schema",
    "pace_store": "jobs.paces",
    "pipeline_store": "store.pipelines",
    "pending_writes": "jobs.pending",
    "progress_milestones": "jobs.milestones",
    "retention": "store.retention",
    "arrivals": "store.arrivals",
    "event_cap": "jobs.event_cap",  # how many of an attempt's log events are kept as rows
    # notify: telling people
    "alerts": "notify.alerts",
    "notices": "notify.notices",
    "redact": "notify.redact",
    # gpu: NVML and the kernel's word on the GPUs
    "gpu": "gpu.nvml",
    "gpu_faults": "daemon.gpu_faults",  # routes samples to runners and the metrics
    "gpu_health": "gpu.health",
    "gpu_holders": "jobs.gpu_holders",  # a stop's wait on a host's processes: acting, above hosts/
    "kernel_xids": "gpu.kernel_xids",
    # jobs: the domain — the owner of the runners, and what it uses
    "jobs": "jobs.owner",
    "runner": "jobs.runner",
    "recorder": "jobs.recorder",
    "recovery": "jobs.recovery",
    "pipelines": "jobs.pipelines",
    "pipeline_eta": "jobs.pipeline_eta",
    "sharding": "jobs.sharding",
    "shard_views": "jobs.shard_views",
    "snapshot": "jobs.snapshot",
    "stopping": "jobs.stopping",
    "strays": "jobs.strays",
    "policy": "jobs.policy",
    "dependencies": "jobs.dependencies",
    "placement": "spec.placement",  # where shards run is part of what a job is
    "usage": "core.usage",  # AttemptUsage: a value hosts, store and API all carry
    "matching": "jobs.matching",
    # daemon: the process, its API and its web page
    "daemon": "daemon.process",
    "service": "daemon.service",
    "api": "daemon.api",
    "web": "daemon.web",
    "streams": "daemon.streams",
    "metrics": "daemon.metrics",
    "views": "jobs.views",  # what the Supervisor answers its verbs with
    # cli: every verb and the client it talks through
    "client": "cli.client",
    "watch": "cli.watch",
    "report": "cli.report",
    "doctor": "cli.doctor",
    # hosts: one sub-package per kind of host
    "hosts.local": "hosts.local.host",
    "hosts.local_follow": "hosts.local.follow",
    "hosts.cgroup": "hosts.local.cgroup",
    "hosts.ssh": "hosts.ssh.host",
    "hosts.ssh_agent": "hosts.ssh.agent",
    "hosts.ssh_connection": "hosts.ssh.connection",
    "hosts.ssh_exits": "hosts.ssh.exits",
    "hosts.ssh_follow": "hosts.ssh.follow",
    "hosts.ssh_mux": "hosts.ssh.mux",
    "hosts.ssh_mux_agent": "hosts.ssh.mux_agent",
    "hosts.ssh_mux_follow": "hosts.ssh.mux_follow",
    "hosts.ssh_target": "hosts.ssh.target",
    "hosts.slurm": "hosts.slurm.host",
    "hosts.slurm_files": "hosts.slurm.files",
    "hosts.slurm_jobs": "hosts.slurm.jobs",
    "hosts.slurm_ssh": "hosts.slurm.ssh",
}

PACKAGES = {"runner", "api", "web"}  # whole packages moved as they are

FACES: dict[str, str] = {
    "core": "The vocabulary every layer speaks: events, errors, the API's messages, records, settings.",
    "spec": "What a job is: its spec, the fields a user may set, pipeline files.",
    "store": "What is kept: the SQLite store, its schema, and what is pruned from it.",
    "notify": "Telling people: alerts, what each says, and the secrets kept out of them.",
    "gpu": "The GPUs as NVML and the kernel log report them.",
    "jobs": "The jobs domain: the Supervisor owns the runners and every verb on them.",
    "daemon": "The daemon process: its lifecycle, its control API and its web page.",
    "hosts.local": "This machine as a host.",
    "hosts.ssh": "A box reached over SSH, through a multiplexed agent.",
    "hosts.slurm": "A Slurm cluster as a host.",
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini", ".service", ".sh", ".json", ""}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _full(rel: str) -> str:
    return f"{PKG}.{rel}"


def _path_of(module: str) -> Path:
    return ROOT.joinpath(*module.split("."))


def _absolutize(path: Path, module: str, is_package: bool) -> None:
    """Relative imports become absolute, so a moved file's imports still name what they meant."""
    text = path.read_text()

    def absolute(match: re.Match[str]) -> str:
        dots, rest = match.group(2), match.group(3)
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (len(dots) - 1)]
        target = ".".join(base + ([rest] if rest else []))
        return f"{match.group(1)}from {target} import"

    new = re.sub(r"(?m)^(\s*)from (\.+)([\w.]*) import", absolute, text)
    if new != text:
        path.write_text(new)


def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _new_modules() -> set[str]:
    found = set()
    for path in (ROOT / PKG).rglob("*.py"):
        found.add(_module_of(path)[0])
    return found


def _move() -> None:
    for old, new in MOVES.items():
        src, dst = _path_of(_full(old)), _path_of(_full(new))
        if src.with_suffix(".py").is_file():
            source, target = src.with_suffix(".py"), dst.with_suffix(".py")
        elif old in PACKAGES and src.is_dir() and not dst.exists():
            source, target = src, dst
        else:
            continue  # done by an earlier run
        target.parent.mkdir(parents=True, exist_ok=True)
        _git("mv", str(source.relative_to(ROOT)), str(target.relative_to(ROOT)))
    for new in {n.rsplit(".", 1)[0] for n in MOVES.values()}:
        init = _path_of(_full(new)) / "__init__.py"
        if not init.exists():
            face = FACES.get(new, "")
            init.write_text(f'"""{face}"""\n')
            _git("add", str(init.relative_to(ROOT)))


def _rewriters(new_modules: set[str]):
    dotted = {_full(o): _full(n) for o, n in MOVES.items()}
    keys = sorted(dotted, key=len, reverse=True)
    dot_re = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w])((?:\.\w+)?)")

    def dot_sub(match: re.Match[str]) -> str:
        key, tail = match.group(1), match.group(2)
        # Already the new layout: a package that took an old module's name, followed by one of
        # its own modules (supervisor.hosts.ssh.mux), is left alone.
        if tail and f"{key}{tail}" in new_modules:
            return match.group(0)
        # ... and so is `from supervisor.hosts.ssh import mux`.
        after = re.match(r" import \(?\s*(\w+)", match.string[match.end():])
        if not tail and after and f"{key}.{after.group(1)}" in new_modules:
            return match.group(0)
        return dotted[key] + tail

    from_re = re.compile(r"(?m)^(\s*)from ([\w.]+) import (\(?)([\w ,\n]+?)(\)?)$")

    def from_sub(match: re.Match[str]) -> str:
        indent, base, opening, names, closing = match.groups()
        if not base.startswith(PKG):
            return match.group(0)
        items = [n.strip() for n in names.replace("\n", " ").split(",") if n.strip()]
        moved, kept = [], []
        for item in items:
            name, _, alias = item.partition(" as ")
            name = name.strip()
            full = f"{base}.{name}"
            if full in dotted:
                parent, leaf = dotted[full].rsplit(".", 1)
                local = alias.strip() or name
                moved.append(f"{indent}from {parent} import {leaf}" + (f" as {local}" if local != leaf else ""))
            else:
                kept.append(item)
        if not moved:
            return match.group(0)
        lines = []
        if kept:
            lines.append(f"{indent}from {base} import {opening}{', '.join(kept)}{closing}")
        return "\n".join(lines + moved)

    paths = {}
    for old, new in MOVES.items():
        o, n = f"{PKG}/{old.replace('.', '/')}", f"{PKG}/{new.replace('.', '/')}"
        paths[o + ".py"] = n + ".py"
        if old in PACKAGES:  # a module's name with a slash is the package that took its name
            paths[o + "/"] = n + "/"
    pkeys = sorted(paths, key=len, reverse=True)
    path_re = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(k) for k in pkeys) + r")")

    # Tests that name files relative to the package (`"runner/"`, `"metrics.py"`) as quoted strings.
    inner = {k[len(PKG) + 1:]: v[len(PKG) + 1:] for k, v in paths.items()}
    inner_re = re.compile(r"""(?<=["'])(""" + "|".join(re.escape(k) for k in sorted(inner, key=len, reverse=True)) + ")")

    def rewrite(text: str, python: bool) -> str:
        if python:
            text = from_re.sub(from_sub, text)
            if "relative_to(PACKAGE)" in text:
                text = inner_re.sub(lambda m: inner[m.group(1)], text)
        text = dot_re.sub(dot_sub, text)
        return path_re.sub(lambda m: paths[m.group(1)], text)

    return rewrite


def _packages_list(text: str) -> str:
    """pyproject's explicit package list: every package under supervisor/ as it is now."""
    packages = sorted(
        _module_of(p)[0] for p in (ROOT / PKG).rglob("__init__.py") if "_builtin" not in p.parts
    )
    match = re.search(r'(?ms)^packages = \[\n(.*?)\n\]', text)
    if not match:
        return text
    builtin = [line for line in match.group(1).splitlines() if "_builtin" in line]
    body = "\n".join([f'    "{p}",' for p in packages] + builtin)
    return text[: match.start(1)] + body + text[match.end(1):]


def main() -> int:
    for path in (ROOT / PKG).rglob("*.py"):
        _absolutize(path, *_module_of(path))
    _move()
    rewrite = _rewriters(_new_modules())
    for rel in _git("ls-files").splitlines():
        path = ROOT / rel
        if rel == "tests/relayout.py" or not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, path.suffix == ".py")
        if rel == "pyproject.toml":
            new = _packages_list(new)
        if new != text:
            path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
