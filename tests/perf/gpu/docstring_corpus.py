"""Natural English text with no download: the docstrings of the Python installed on this machine.

    python tests/perf/gpu/docstring_corpus.py [--max N]       (prints the sources and counts)

The text comes from the source files of the standard library and of a few large, well-documented
packages if installed (transformers, torch, numpy), read with ``ast`` (nothing is imported). Every
module, class and function docstring of at least 80 characters becomes one conversation: the user asks
about the object by its dotted name; the assistant answers with a short thinking section built from the
code (what kind of object, its module, its parameters or bases) and then the docstring itself (cut at
3,000 characters). Docstrings are deduplicated by their text (the first file in sorted order keeps it).

The split is by source file (a hash of the package and the file's path), so held-out conversations come
from files the target never saw: one file in ``HELD_EVERY`` is held out. The order is deterministic: the
same installed packages give the same corpus.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("transformers", "torch", "numpy")
MIN_CHARS, MAX_CHARS, HELD_EVERY = 80, 3000, 10
THINK, END_THINK = "<think>", "</think>"


@dataclass(frozen=True)
class Doc:
    source: str  # package/relative path of the file
    module: str  # dotted name of the file's module
    name: str  # dotted name of the object
    kind: str  # module | class | function
    detail: str  # parameters or bases, for the thinking section
    text: str

    def messages(self, with_answer: bool = True) -> list[dict[str, str]]:
        ask = [{"role": "user", "content": f"Explain `{self.name}`."}]
        return [*ask, {"role": "assistant", "content": self.answer()}] if with_answer else ask

    def answer(self) -> str:
        think = f"The user asks about the {self.kind} `{self.name}`"
        think += f" in the module `{self.module}`" if self.kind != "module" else ""
        think += f"; {self.detail}." if self.detail else "."
        return f"{THINK}\n{think}\n{END_THINK}\n\n{self.text}"

    @property
    def held(self) -> bool:
        return int(hashlib.sha1(self.source.encode()).hexdigest(), 16) % HELD_EVERY == 0


def roots() -> list[tuple[str, Path]]:
    out = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    for pkg in PACKAGES:
        spec = importlib.util.find_spec(pkg)  # top-level lookup only: the package is not imported
        if spec is not None and spec.submodule_search_locations:
            out.append((pkg, Path(next(iter(spec.submodule_search_locations)))))
    return out


def _detail(node: ast.AST) -> str:
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases][:4]
        return f"it derives from {', '.join(f'`{b}`' for b in bases)}" if bases else ""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                 if a.arg not in ("self", "cls")][:8]
        return f"its parameters are {', '.join(f'`{n}`' for n in names)}" if names else "it takes no parameters"
    return ""


def _file_docs(job: tuple[str, str, str]) -> list[Doc]:
    pkg, root, rel = job
    path = Path(root) / rel
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return []
    parts = Path(rel).with_suffix("").parts
    module = ".".join(([] if pkg == "stdlib" else [pkg]) + [p for p in parts if p != "__init__"]) or pkg
    out: list[Doc] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                add(child, name, "class" if isinstance(child, ast.ClassDef) else "function")
                visit(child, name)

    def add(node: ast.AST, name: str, kind: str) -> None:
        doc = ast.get_docstring(node)  # type: ignore[arg-type]
        if doc and len(doc) >= MIN_CHARS:
            out.append(Doc(f"{pkg}/{rel}", module, name, kind, _detail(node), doc[:MAX_CHARS]))

    add(tree, module, "module")
    visit(tree, module)
    return out


def collect(max_docs: int | None = None, workers: int = 8) -> tuple[list[Doc], list[str]]:
    """(documents in a fixed order, one line per source root with its counts)."""
    jobs, notes = [], []
    for pkg, root in roots():
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
        # Tests and vendored third-party trees are skipped: little prose, much repetition.
        files = [f for f in files if not ({"test", "tests", "site-packages", "_vendor"} & set(Path(f).parts))]
        jobs += [(pkg, str(root), f) for f in files]
        notes.append(f"{pkg}: {root} ({len(files)} files)")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        per_file = list(pool.map(_file_docs, jobs, chunksize=32))
    seen: set[str] = set()
    docs: list[Doc] = []
    for file_docs in per_file:
        for d in file_docs:
            if d.text not in seen:
                seen.add(d.text)
                docs.append(d)
    return (docs[:max_docs] if max_docs else docs), notes


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int)
    a = ap.parse_args()
    docs, notes = collect(a.max)
    print("\n".join(notes))
    held = sum(d.held for d in docs)
    print(f"{len(docs)} docstrings, {sum(len(d.text) for d in docs) / 1e6:.1f}M characters; "
          f"{held} held out ({HELD_EVERY and 100 // HELD_EVERY}% of files)")
    print(docs[len(docs) // 2].messages())
    sys.exit(0)
