"""A worker that cannot start its housekeeping (heartbeat, sweeps, stop signals) ends at once, rather than take jobs
while `pid workers` says no worker is alive: Celery only logs what a worker_ready handler raises. `pid worker` checks
the settings first; a Celery worker of pid's app started any other way meets the bad one only as it gets ready."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.cli   # a real Celery worker, on the embedded queue

CELERY_WORKER = ("from pid.worker.app import app; "
                 "app.worker_main(['worker', '--concurrency=1', '--without-gossip', '--without-mingle'])")


def test_a_celery_worker_whose_start_fails_exits_saying_why(pid_env, tmp_path):
    done = subprocess.run([sys.executable, "-c", CELERY_WORKER], cwd=tmp_path, env={**pid_env, "PID_SWEEP_S": "soon"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "pid worker cannot start its housekeeping ($PID_SWEEP_S: 'soon' is not a number of seconds above 0" \
           in done.stderr, done.stderr[-2000:]
    assert "pid worker ready" not in done.stderr
