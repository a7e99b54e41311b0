"""The README's first command, run as written (less the set-up script), against a scripted model server: the
terminal tells the job's story alone, and the worker's own lines go to its log file."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from pid.sandbox.reaper import TEST_RUN_ENV
from tests.conftest import IMAGE, ROOT, RUN_ID
from tests.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.docker, pytest.mark.cli]


def first_command() -> str:
    """The one-line command under "Two commands on a fresh machine", without `bash docker/setup.sh && `."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Two commands on a fresh machine", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert block.startswith("bash docker/setup.sh && "), block
    return block.removeprefix("bash docker/setup.sh && ")


def test_the_first_command_prints_one_clean_story(tmp_path: Path):
    project = tmp_path / "my-project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    turns = [{"tool_calls": [{"name": "edit", "arguments": {
        "path": "calc.py", "edits": [{"oldText": "a - b", "newText": "a + b"}]}}]},
        {"text": "Fixed add: it subtracted."}]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))}
    env.update(PID_HOME=str(tmp_path / "home"), PID_IMAGE=IMAGE, PYTHONPATH=str(ROOT),
               PATH=f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}", **{TEST_RUN_ENV: RUN_ID})
    with ScriptedLLM(turns) as llm:
        command = first_command().replace("http://localhost:8000/v1", llm.base_url)
        # then stop the worker the way the README says, and wait for it
        proc = subprocess.Popen(["bash", "-c", command + "; code=$?; kill %1; wait; exit $code"], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert re.fullmatch(r"job \S+ queued", lines[0]), out
    assert "✓ edit calc.py" in out and "Fixed add: it subtracted." in out
    assert re.search(r"^completed \(stop\) in .* · 2 turns · 1 tool call", out, re.M), out
    assert out.count("completed (stop) in") == 1, out   # the job's end said once, by the summary
    assert re.search(r"^artifacts: pid-runs/\S+$", out, re.M), out
    # none of the worker's own lines: they are in its log
    assert "pid worker ready" not in out and "Warm shutdown" not in out and not re.search(r"^\[\d{4}-", out, re.M)
    log = (tmp_path / "pid-worker.log").read_text()
    assert "pid worker ready" in log and re.search(r"job \S+ started: Fix the failing test", log), log
    assert "a + b" in next((tmp_path / "pid-runs").glob("*/patch.diff")).read_text()
