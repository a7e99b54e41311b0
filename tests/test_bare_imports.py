"""No absolute import of the bare folder names cli, worker, sandbox, jobs anywhere in the code or its tests.

pid/cli, pid/worker, pid/sandbox and pid/jobs are symlinks to the top-level folders (pyproject.toml's package-dir):
run from the checkout, `import sandbox.disk` would also work, and load a second copy of the module, with its own state
(a second registry, a second lock, a class that `isinstance` does not recognise). Only `pid.sandbox...` or a relative
import is the module. Read from the source (ast), function-level imports included."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BARE = {"cli", "worker", "sandbox", "jobs"}
FOLDERS = ["pid", "cli", "worker", "sandbox", "jobs", "tests", "bench"]


def bare_imports(source: str) -> list[str]:
    """The absolute imports in `source` whose first name is one of the bare folder names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in BARE]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.split(".")[0] in BARE:
                found.append(node.module)
    return found


def python_files() -> list[Path]:
    """Every .py file of the folders, walked where it is (rglob does not follow pid/'s symlinks: each once)."""
    return sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py") if ".venv" not in path.parts)


def test_no_module_imports_a_bare_folder_name():
    files = python_files()
    assert len(files) > 100 and ROOT / "sandbox" / "disk.py" in files and ROOT / "pid" / "agent.py" in files
    bad = {str(path.relative_to(ROOT)): names for path in files if (names := bare_imports(path.read_text()))}
    assert bad == {}


def test_a_bare_import_is_found_wherever_it_stands_and_the_right_ones_pass():
    source = ("import sandbox.disk\nfrom worker import runner\ndef f():\n    from jobs.spec import JobSpec\n"
              "    import cli as c\n")
    assert bare_imports(source) == ["sandbox.disk", "worker", "jobs.spec", "cli"]
    fine = ("from pid.sandbox import disk\nimport pid.worker.runner\nfrom . import runner\nfrom .sandbox import x\n"
            "from ..jobs import spec\nimport sandboxes\nimport clickx\n")
    assert bare_imports(fine) == []
