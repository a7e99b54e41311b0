"""The wheel installs pid's own name alone: the folders cli/, worker/, sandbox/… go in as pid.cli, pid.worker,
pid.sandbox… (pyproject.toml's package-dir), never as top-level modules of those generic names in site-packages.
The checkout reaches them under the same names through the symlinks pid/<folder> (mypy, python -m pid.cli.main)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def package_dir() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def test_every_top_level_package_is_mapped_under_pid_and_linked_from_pid():
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"pid", "tests"}
    mapped = package_dir()
    assert mapped == {f"pid.{name}": name for name in sorted(folders)}
    for name in folders:
        link = ROOT / "pid" / name
        assert link.is_symlink() and os.readlink(link) == os.path.join("..", name), link


@pytest.mark.cli
def test_the_wheel_holds_pid_alone_with_every_module_and_script(tmp_path):
    """Built offline from what docker/Dockerfile.worker copies (pyproject.toml, README.md, pid/ and the folders)."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    mapped = package_dir()
    for folder in ["pid", *mapped.values()]:
        shutil.copytree(ROOT / folder, src / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--wheel-dir", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel, = (tmp_path / "dist").glob("pid-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert {n.split("/")[0] for n in names} == {"pid", wheel.name.split("-py3")[0] + ".dist-info"}
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "pid").rglob("*.py")}   # (rglob stays out of the links)
    for dotted, folder in mapped.items():
        top = dotted.replace(".", "/")
        expected |= {top + "/" + str(p.relative_to(ROOT / folder)) for p in (ROOT / folder).rglob("*")
                     if p.suffix in (".py", ".sh", ".lua")}
    assert expected - names == set()
    assert "pid = pid.cli.main:main" in entry_points
