"""The two test tiers: without an engine, every `docker` test is skipped for one stated reason (and the fast tier
runs on); the fixtures of tool_sandbox mark what they need."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_without_an_engine_docker_tests_are_skipped_with_one_reason(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "PID_"))}
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-W", "ignore",
                           "tests/test_tools_write.py", "-k", "overwrites or fifo"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # the in-memory variants pass; the docker variant and the docker-only test are skipped, for one reason
    assert "2 passed, 2 skipped" in out, out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1 and "[2]" in skips[0] and "no Docker engine reachable" in skips[0], out
