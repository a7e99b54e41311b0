"""A worker raises its open-files limit so that its jobs fit, and says so when it cannot."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import logging, resource, sys
logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from pid.worker.main_process import raise_open_files_limit
print("limit", raise_open_files_limit(int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def probe(soft: int, hard: int, concurrency: int) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", PROBE, str(soft), str(hard), str(concurrency)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_soft_limit_goes_up_to_what_the_jobs_need():
    assert probe(300, 4096, 64).splitlines()[-1] == "limit 2304 2304"   # 256 + 32 per job


def test_a_limit_that_is_enough_is_left_alone():
    assert probe(4000, 4096, 8).splitlines()[-1] == "limit 4000 4000"


def test_a_hard_limit_too_low_is_reported():
    out = probe(300, 1000, 64)
    assert out.splitlines()[-1] == "limit 1000 1000"
    assert "fewer than 64 jobs at once may need (2304)" in out
