"""Time a `pid` command against a scripted model: to its first model request, and to its end (shared by the
start-up benchmarks)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.scripted_llm import ScriptedLLM  # noqa: E402


def time_pid(args: list[str], home: str, script: list[dict[str, Any]] | None = None) -> tuple[float, float]:
    """(seconds to the first model request, seconds to the command's end) of `pid ARGS --model scripted
    --base-url <a scripted model>`, run from the repository with PID_HOME=home. Raises when it fails or never asks."""
    with ScriptedLLM(script or [{"text": "done"}]) as llm:
        env = dict(os.environ, PID_HOME=home, PYTHONPATH=ROOT)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", *args, "--model", "scripted",
                                 "--base-url", llm.base_url], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = None
        while first is None and proc.poll() is None:
            if llm.requests:
                first = time.monotonic() - started
            time.sleep(0.002)
        if proc.wait(timeout=300) != 0:
            raise RuntimeError(f"pid {' '.join(args[:1])} failed")
        if first is None:
            raise RuntimeError("pid ended without asking the model")
        return first, time.monotonic() - started
