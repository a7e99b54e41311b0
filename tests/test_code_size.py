"""No production function over 80 lines, no class over 400 (issue 23): past that, a newcomer cannot hold one in mind,
and only its author changes it safely. Read from the source (ast), over the same modules as the import-cycle test.
"""
from __future__ import annotations

import ast

from tests.test_import_cycles import ROOT, modules, packages

MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 400


def too_long() -> list[str]:
    found = []
    for name, path in sorted(modules(ROOT, packages(ROOT)).items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else \
                MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            if limit is None:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append(f"{name}.{node.name}: {lines} lines (at most {limit})")
    return found


def test_no_function_or_class_is_too_long() -> None:
    assert too_long() == []


def test_the_check_sees_a_long_function_and_a_long_class(tmp_path, monkeypatch) -> None:
    """The walk is not vacuous: a long function, and a long class of short methods, in a module it reads are
    reported."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    n = MAX_CLASS_LINES // 3 + 1   # three lines a method, the blank one between them: a class of 3 * n lines
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(n))
    path = tmp_path / "long.py"
    path.write_text(f"def long():\n{body}\n\n\nclass Big:\n{methods}")
    monkeypatch.setattr("tests.test_code_size.modules", lambda root, packages: {"pid.long": path})
    assert too_long() == [f"pid.long.long: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})",
                          f"pid.long.Big: {3 * n} lines (at most {MAX_CLASS_LINES})"]


def test_the_in_container_server_stays_reviewable() -> None:
    """The trust boundary (issue 23): channel.sh, the server a bash call goes through, at most ~400 lines; each part
    it sources (the greeting, the requests on outputs and processes, what sh uses without bash) a small one."""
    sandbox = ROOT / "sandbox"
    sizes = {path.name: len(path.read_text().splitlines()) for path in sandbox.glob("channel*.sh")}
    assert sizes["channel.sh"] <= 400, sizes
    assert set(sizes) == {"channel.sh", "channel_hello.sh", "channel_ops.sh", "channel_sh.sh"}, sizes
    assert all(lines <= 120 for name, lines in sizes.items() if name != "channel.sh"), sizes
