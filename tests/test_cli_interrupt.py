"""A Ctrl-C of the `pid` command ends in exit code 130 wherever it lands (no engine, no store)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, ctrl_c_default

# Loaded as the `pid` command would be, then a Ctrl-C inside code that exec() runs from a string (as each dataclass's
# __init__ is made while pid's modules load), caught as pid.cli.main's main() catches it.
PROBE = """\
import os, signal, sys
sys.argv[0] = "/usr/local/bin/pid"   # (what cli/__init__.py takes for the command)
import pid.cli
import pid.cli.main
pid.cli.main.loaded()   # (as main() begins)
if signal.getsignal(signal.SIGINT) is not pid.cli.raise_interrupted:
    sys.exit("not the command's handler")
try:
    exec("os.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10 ** 8): pass")
except KeyboardInterrupt:
    sys.exit(130)
sys.exit("the Ctrl-C never came")
"""


def test_a_ctrl_c_caught_after_passing_through_exec_d_code_exits_130_under_python_m(tmp_path: Path):
    """CPython (3.10–3.13 at least) ends a `python -m` process by SIGINT, whatever its code asked, once a
    KeyboardInterrupt has passed out of exec()'d code: `python -m pid.cli.main run` interrupted as it loaded exited
    -2, not 130, in CI. pid's handler raises a KeyboardInterrupt of its own class, which CPython leaves alone."""
    (tmp_path / "ctrl_c_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "ctrl_c_probe"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, preexec_fn=ctrl_c_default)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
