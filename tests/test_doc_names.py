"""Every module or file the map names exists: the docstrings and comments in supervisor/ and the pages
in docs/ (with README.md and jobs/README.md) name modules by path (`jobs/runner/_watching.py`), by
dotted name (`supervisor.hosts.reach`, `records.RecordBuffer`) and in each package's module map (the
indented `name   what it holds` lines of its ``__init__``); after a module moves, a name left behind
sends the reader to nothing.  docs/results/ is left out: it is the measurement record, and each
section names the modules as they were when it was measured.  Pure text and AST: no import, no I/O
beyond reading the files, so it runs in well under a second."""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "supervisor"
SKIPPED_DIRS = {"build", "dist", "site", "__pycache__", "node_modules"}  # and every .hidden one (.git, .venv)

# Files of other projects (a traceback's frames, an upstream model's source, a user's own script in an
# example) that the pages name by their bare names: not ours to resolve.
FOREIGN_FILES = {
    "adam.py", "api_utils.py", "deepseek_v2.py", "executor.py", "file.py", "gpu_model_runner.py",
    "gpu_worker.py", "hello.py", "job.py", "launcher.py", "llama_eagle3.py", "loader.py", "nonexistent.py",
    "stuck.py", "x.py",
}

# A path: directories then a file with a suffix the repository uses.  A bare name counts only as a
# Python file (`records.py`); other bare names (`config.toml`, `manifest.json`) are a user's files.
_PATH = re.compile(r"(?<![\w/.$-])((?:\.\.?/)*(?:[\w-]+/)*[\w-]+"
                   r"\.(?:py|toml|md|json|txt|sh|service|yml|yaml|lock))(?![\w/])")
# A dotted name in backticks: `supervisor.hosts.reach`, `records.RecordBuffer`, ``_replay.ReplayReport``.
_DOTTED = re.compile(r"``?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``?")
# One line of a package's module map: four spaces, a name, two or more spaces, what it holds.
_MAP_LINE = re.compile(r"^ {4}(\w+)/?(?: {2,}| *$)", re.MULTILINE)


@dataclass(frozen=True)
class Text:
    """A piece of prose that may name modules: the file it is in, the line it starts on, its words."""

    doc: Path  # also what a relative path is relative to
    line: int
    body: str

    def where(self, offset: int) -> str:
        return f"{self.doc.relative_to(REPO).as_posix()}:{self.line + self.body.count(chr(10), 0, offset)}"


def _tracked_tree() -> tuple[list[str], set[str]]:
    files: list[str] = []
    dirs: set[str] = set()
    for top, subdirs, names in os.walk(REPO):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.startswith(".") and not d.endswith(".egg-info")]
        rel = Path(top).relative_to(REPO)
        files.extend((rel / name).as_posix() for name in names)
        if rel.parts:
            dirs.add(rel.as_posix())
    return files, dirs


FILES, DIRS = _tracked_tree()
DIR_NAMES = {d.rsplit("/", 1)[-1] for d in DIRS} | {"supervisor"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _old_names() -> set[str]:
    """The flat layout's module names that tests/relayout.py moved (its ``MOVES`` table, read as data)
    and that name no module now: `ssh_mux`, `pending_writes`.  Only names with an underscore, which no
    sentence uses as a word (`store`, `runner` are words too)."""
    tree = ast.parse((REPO / "tests" / "relayout.py").read_text(encoding="utf-8"))
    moves = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and n.target.id == "MOVES")
    assert isinstance(moves, ast.Dict)
    leaves = {m.rsplit(".", 1)[-1] for m in MODULES}
    old = {ast.literal_eval(k).rsplit(".", 1)[-1] for k in moves.keys if k is not None}
    return {name for name in old if "_" in name.strip("_") and name not in leaves}


OLD_NAMES = _old_names()
_OLD = re.compile(r"(?<!\w)(" + "|".join(sorted(OLD_NAMES, key=len, reverse=True)) + r")(?!\w)")


def _statements(node: ast.AST) -> Iterator[ast.AST]:
    """The node and every statement under it, never an expression's parts: docstrings are the first
    statement of a module, class or function body, and walking every expression costs seconds."""
    yield node
    for field in ("body", "orelse", "handlers", "finalbody", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                yield from _statements(child)


def _texts() -> Iterator[Text]:
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in _statements(_tree(path)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield Text(path, node.body[0].lineno, doc)
        for number, line in enumerate(source.splitlines(), 1):
            if "# " in line:
                yield Text(path, number, line[line.index("# "):])
    pages = [REPO / "README.md", REPO / "jobs" / "README.md",
             *(p for p in (REPO / "docs").rglob("*.md") if "results" not in p.relative_to(REPO / "docs").parts)]
    for page in sorted(pages):
        yield Text(page, 1, page.read_text(encoding="utf-8"))


def path_resolves(name: str, doc: Path) -> bool:
    """A path names a file (or directory) of the tree: relative to the page it is on, or as the tail of
    a repository path (`runner/_job.py` is supervisor/jobs/runner/_job.py)."""
    if name.startswith("."):
        return (doc.parent / name).resolve().exists()
    return any(f == name or f.endswith("/" + name) for f in FILES)


def names_ours(name: str) -> bool:
    """Whether a path claims to be one of ours: its first directory is one the repository has, or it is
    a bare Python file not on the list of other projects' files."""
    if name.startswith("."):
        return True
    if "/" in name:
        return name.split("/", 1)[0] in DIR_NAMES
    return name.endswith(".py") and name not in FOREIGN_FILES


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _top_level_names(path: Path) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in _tree(path).body:
        targets: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks and the like
            for sub in node.body + node.orelse:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    for alias in sub.names:
                        names[(alias.asname or alias.name).split(".")[0]] = sub
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    names[sub.id] = node
    return names


def _attribute_resolves(module: str, rest: list[str]) -> bool:
    if not rest:
        return True
    child = f"{module}.{rest[0]}"
    if child in MODULES:
        return _attribute_resolves(child, rest[1:])
    node = _top_level_names(MODULES[module]).get(rest[0])
    if node is None:
        return False
    if isinstance(node, ast.ClassDef) and len(rest) > 1:
        members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        members |= {t.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(t := n.target, ast.Name)}
        members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        return rest[1] in members
    return True  # a name bound by an import or an assignment: what it holds is not followed


def dotted_resolves(name: str) -> bool:
    """`supervisor.a.b`, or a tail of a module's dotted name (`hosts.base`, `records`) followed by names
    that module defines (`records.RecordBuffer`, `errors.TABLE`, `Host.launch` inside a class)."""
    parts = name.split(".")
    if parts[0] == "supervisor":
        return any(name == m or (name.startswith(m + ".") and _attribute_resolves(m, name[len(m) + 1:].split(".")))
                   for m in MODULES)
    for cut in range(len(parts), 0, -1):
        tail = ".".join(parts[:cut])
        owners = [m for m in MODULES if m.endswith("." + tail)]
        if owners:
            return any(_attribute_resolves(m, parts[cut:]) for m in owners)
    return True  # no module by that name: not a module name (a spec field, `model.safetensors`)


def dotted_is_checked(name: str) -> bool:
    """A dotted name is taken for a module path when it starts with `supervisor.`, or its first part is
    a module's name and the next is a class, a constant or a private name (capital or underscore):
    spec fields share names with modules (`health.stall_s`, `gpu.devices`) and are all lower case."""
    parts = name.split(".")
    if parts[0] == "supervisor":
        return True
    leaves = {m.rsplit(".", 1)[-1] for m in MODULES}
    return parts[0] in leaves and (parts[1][:1].isupper() or parts[1].startswith("_") or
                                   any(m.endswith("." + ".".join(parts)) for m in MODULES))


def module_map_names(docstring: str) -> list[str]:
    """The names a package's module map lists (the indented `name   what it holds` lines)."""
    return _MAP_LINE.findall(docstring)


def stale_names() -> list[str]:
    stale: list[str] = []
    for text in _texts():
        for match in _PATH.finditer(text.body):
            name = match.group(1)
            if names_ours(name) and not path_resolves(name, text.doc):
                stale.append(f"{text.where(match.start())}: {name}")
        for match in _DOTTED.finditer(text.body):
            name = match.group(1)
            if dotted_is_checked(name) and not dotted_resolves(name):
                stale.append(f"{text.where(match.start())}: {name}")
        stale.extend(f"{text.where(m.start())}: {m.group(1)} (a module's name before the move)"
                     for m in _OLD.finditer(text.body))
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = init.parent
        for name in module_map_names(ast.get_docstring(_tree(init), clean=False) or ""):
            if not (package / f"{name}.py").is_file() and not (package / name / "__init__.py").is_file():
                stale.append(f"{init.relative_to(REPO).as_posix()} (module map): {name}")
    return stale


def test_the_name_patterns_find_what_the_map_names() -> None:
    text = ("see `jobs/runner/_watching.py`, records.py and ../reference/cli.md; ``_replay.ReplayReport``,\n"
            "`supervisor.hosts.reach`, `health.stall_s`, hello.toml, torch/distributed/run.py")
    paths = [m.group(1) for m in _PATH.finditer(text)]
    assert paths == ["jobs/runner/_watching.py", "records.py", "../reference/cli.md", "hello.toml",
                     "torch/distributed/run.py"]
    assert [p for p in paths if names_ours(p)] == ["jobs/runner/_watching.py", "records.py", "../reference/cli.md"]
    dotted = [m.group(1) for m in _DOTTED.finditer(text)]
    assert [d for d in dotted if dotted_is_checked(d)] == ["_replay.ReplayReport", "supervisor.hosts.reach"]
    assert module_map_names("The pack.\n\n    _job        the loop\n    local/      this machine\n      cont.\n") == \
        ["_job", "local"]


@pytest.mark.parametrize(("name", "resolves"), [
    ("supervisor.hosts.reach", True), ("supervisor.hosts.ssh_mux", False), ("supervisor.daemon.process", True),
    ("records.RecordBuffer", True), ("records.NoSuchThing", False), ("jobs.owner.Supervisor", True),
    ("jobs.Supervisor", False),
    ("hosts.base", True), ("base.Host.launch", True), ("base.Host.no_such_method", False),
])
def test_a_dotted_name_resolves_against_the_package(name: str, resolves: bool) -> None:
    assert dotted_resolves(name) is resolves


@pytest.mark.parametrize(("name", "resolves"), [
    ("supervisor/jobs/runner/_watching.py", True), ("runner/_job.py", True), ("jobs/eagle3/extract.py", True),
    ("records.py", True), ("hosts/ssh_mux.py", False), ("gpu.py", False), ("supervisor/follow.py", False),
])
def test_a_path_resolves_against_the_tree(name: str, resolves: bool) -> None:
    assert path_resolves(name, REPO / "README.md") is resolves


def test_the_old_names_are_the_flat_layouts() -> None:
    assert {"ssh_mux", "ssh_mux_agent", "pending_writes", "pace_store", "slurm_ssh"} <= OLD_NAMES
    assert not OLD_NAMES & {"store", "runner", "jobs", "gpu_faults"}  # words, or a module still so named
    assert [m.group(1) for m in _OLD.finditer("see ssh_mux, hosts.slurm_ssh and ssh_muxes")] == ["ssh_mux", "slurm_ssh"]


def test_every_module_or_file_the_docs_and_docstrings_name_exists() -> None:
    stale = stale_names()
    assert not stale, ("these name a module or file the tree does not have (moved or renamed?): name it "
                       "where it is now, or add another project's file to FOREIGN_FILES:\n" + "\n".join(stale))
