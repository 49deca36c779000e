"""The structure the project promises (issue #23): no module in src/ over 400 lines, no
function over 60 lines (migrations excepted), no import cycle between forgeflow's modules.

The source is read with ``ast`` and never imported, so the test is fast and a cycle is
found even where Python would tolerate it at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "forgeflow"
MIGRATIONS = PACKAGE / "store" / "migrations" / "versions"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: those at its top level, also
    inside ``if``/``try``/``with``, but not in functions or classes' methods nor under
    ``if TYPE_CHECKING:`` (only the type checker follows those)."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _module_level_imports(stmt.body)
            yield from _module_level_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from _module_level_imports(block)
            for handler in stmt.handlers:
                yield from _module_level_imports(handler.body)
        elif isinstance(stmt, ast.With):
            yield from _module_level_imports(stmt.body)


def _package_of(name: str, path: Path, level: int) -> str:
    """The package a relative import of ``level`` dots starts from in module ``name``."""
    parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    return ".".join(parts[: len(parts) - (level - 1)])


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The dotted names one import statement makes its module import. ``from a import
    b`` imports the module ``a.b`` when there is one, else a name of ``a``."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = _package_of(name, path, node.level)
        base = f"{package}.{base}" if base else package
    for alias in node.names:
        yield f"{base}.{alias.name}"
        yield base


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which forgeflow modules each module imports when it is imported."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _module_level_imports(_tree(path).body):
            found = list(_targets(name, path, node))
            if isinstance(node, ast.ImportFrom):
                # pairs of (submodule, package): the submodule when it exists
                for sub, package in zip(found[::2], found[1::2], strict=True):
                    targets.add(sub if sub in modules else package)
            else:
                targets.update(found)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_is_over_400_lines() -> None:
    long: dict[str, int] = {}
    for path in _modules().values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long[str(path.relative_to(SRC))] = lines
    assert long == {}


def test_no_function_is_over_60_lines_outside_migrations() -> None:
    long: dict[str, int] = {}
    for path in _modules().values():
        if MIGRATIONS in path.parents:
            continue
        for fn in _functions(_tree(path)):
            lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long[f"{path.relative_to(SRC)}:{fn.lineno} {fn.name}"] = lines
    assert long == {}


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_import_graph(_modules())) == []


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    # The check above could pass by finding nothing at all; these graphs show it looks.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_relative_and_package_imports(tmp_path: Path) -> None:
    # A package whose module imports a sibling relatively and a name of its package:
    # both edges must be in the graph, the TYPE_CHECKING one must not.
    pkg = tmp_path / "forgeflow" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "forgeflow" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from forgeflow.sub import VALUE\n"
        "if TYPE_CHECKING:\n"
        "    from forgeflow import other\n"
        "def f() -> None:\n"
        "    import forgeflow.other\n"
    )
    (pkg / "b.py").write_text("")
    (tmp_path / "forgeflow" / "other.py").write_text("")
    modules = {
        "forgeflow": tmp_path / "forgeflow" / "__init__.py",
        "forgeflow.other": tmp_path / "forgeflow" / "other.py",
        "forgeflow.sub": pkg / "__init__.py",
        "forgeflow.sub.a": pkg / "a.py",
        "forgeflow.sub.b": pkg / "b.py",
    }
    graph = _import_graph(modules)
    assert graph["forgeflow.sub.a"] == {"forgeflow.sub", "forgeflow.sub.b"}
