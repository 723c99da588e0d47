"""The house rules that keep the package readable, checked: no import cycle, no caller reaching into
another package's private modules.  The layers themselves are import-linter's contracts (pyproject.toml,
run by tests/test_lint.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "supervisor"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _runtime_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `module` imports when it is imported (TYPE_CHECKING blocks and
    imports inside functions are not import-time edges, so they cannot form a cycle)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []:
            if isinstance(sub, ast.ImportFrom):
                target = _resolve(module, path.name == "__init__.py", sub)
                for alias in sub.names:
                    candidate = f"{target}.{alias.name}"
                    found.add(candidate if candidate in known else target)
            elif isinstance(sub, ast.Import):
                found.update(alias.name for alias in sub.names)
    return {m for m in found if m in known and m != module}


def _any_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Every package module named by an import anywhere in the file, TYPE_CHECKING included."""
    found: set[str] = set()
    for sub in ast.walk(ast.parse(path.read_text())):
        if isinstance(sub, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", sub)
            found.add(target)
            found.update(f"{target}.{a.name}" for a in sub.names)
    return found & known


def test_no_import_cycle() -> None:
    modules = _modules()
    known = set(modules)
    graph = {m: _any_imports(p, m, known) - {m} for m, p in modules.items()}
    # A package's __init__ re-exporting its own modules is not a cycle with them.
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and t in modules and modules[t].name == "__init__.py")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles (TYPE_CHECKING imports count: they are a design cycle too):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_runtime_import_graph_is_acyclic_too() -> None:
    modules = _modules()
    known = set(modules)
    graph = {m: _runtime_imports(m, p, known) for m, p in modules.items()}
    seen: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in graph[m]:
            assert seen.get(t) != 1, "runtime import cycle: " + " -> ".join([*path, m, t])
            if t not in seen:
                visit(t, [*path, m])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [])


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    """A package's ``_module`` is its own business: others use what its ``__init__`` exports, so the
    package can be rearranged inside without breaking them."""
    modules = _modules()
    reaching: list[str] = []
    for name, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        own = name if is_package else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(name, is_package, node)
            for imported in [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]:
                parts = imported.split(".")
                private = [k for k, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")]
                if private and own != ".".join(parts[:private[0]]) and \
                        not own.startswith(".".join(parts[:private[0]]) + "."):
                    reaching.append(f"{name} imports {imported}")
    assert not reaching, "import from the package's public face instead: " + "; ".join(reaching)


def test_no_module_outside_hosts_spells_this_machines_host_name() -> None:
    """Host differences are a host's capabilities (``hosts.base``); the one spelling of this machine's
    name is ``core.host_url``.  A ``"local"`` literal elsewhere is a name check creeping back."""
    allowed = {PACKAGE / "core" / "host_url.py"}
    spelled = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path not in allowed and (PACKAGE / "hosts") not in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "local"
    )
    assert not spelled, "use core.host_url (LOCAL_HOST, is_local) or a host capability: " + ", ".join(spelled)
