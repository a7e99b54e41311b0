"""No import cycles among pid's modules (pid/ and the folders pid.cli, pid.worker… are made of), by their top-level
imports.

A cycle makes the order of imports matter (a name missing from a module half loaded) and two modules that can only
be understood together. The graph is read from the source (ast), not by importing: a module's imports are the
import statements at its top level, also inside a top-level `if` or `try` (a function's own imports are left out).
`from pkg import sub` depends on the module pkg.sub alone (its package is loaded first by any import of it).
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def packages(root: Path) -> dict[str, str]:
    """Each package's folder by its dotted name: pid, and the folders pyproject.toml maps under it (pid.cli: cli/)."""
    with open(root / "pyproject.toml", "rb") as f:
        mapped = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {"pid": "pid", **mapped}


def modules(root: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its own name: its __init__.py). The folders are
    walked where they are (rglob does not follow pid/'s symlinks to them)."""
    found = {}
    for package, folder in packages.items():
        for path in (root / folder).rglob("*.py"):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _top_level(statements: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in statements:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + [s for h in node.handlers for s in h.body] + node.orelse
                                  + node.finalbody)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules among `known` that module `name` imports at its top level."""
    found: set[str] = set()
    for node in _top_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        subs = {f"{base}.{alias.name}" for alias in node.names}
        found.update(subs if subs <= known.keys() else subs | {base})
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, each as its strongly connected component (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def import_graph(root: Path, packages: dict[str, str]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def test_pid_s_packages_import_one_another_without_a_cycle():
    graph = import_graph(ROOT, packages(ROOT))
    assert "pid.worker.tasks" in graph and "pid.tools.registry" in graph   # (the packages were found)
    found = cycles(graph)
    assert found == [], "import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) + ")"
        for c in found)


def test_a_cycle_is_found_through_from_imports_relative_ones_and_a_top_level_if(tmp_path):
    """The check itself: a cycle it would have to see, and imports that are not one."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")       # a package loading its module: no cycle
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("import sys\nif sys:\n    from .sub.c import f\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from pkg.a import x\n\ndef f():\n    from pkg import d\n")
    (package / "d.py").write_text("from pkg.sub import c\n")         # only a function imports d: no cycle
    graph = import_graph(tmp_path, {"pkg": "pkg"})
    assert graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
