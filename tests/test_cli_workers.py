"""`pid workers` tells the truth about each worker: alive while it beats; a worker killed on this machine is lost as
soon as its process is gone (not after some silence), and one that stopped cleanly is listed by --all as stopped.
Real `pid worker` processes."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import start_worker, stop_worker
from pid.jobs.workers import ALIVE_WITHIN_S, BEAT_S

pytestmark = pytest.mark.cli


def states(run_pid, *args: str) -> dict[int, str]:
    listed = run_pid("workers", "--json", *args)
    assert listed.code == 0, listed.stderr
    return {w["pid"]: w["state"] for w in json.loads(listed.stdout)}


def test_a_killed_worker_is_lost_at_once_and_a_stopped_one_is_listed_as_stopped(run_pid, pid_env, tmp_path: Path):
    killed = start_worker(pid_env, tmp_path, tmp_path / "killed.log")
    stopped = start_worker(pid_env, tmp_path, tmp_path / "stopped.log")
    try:
        assert states(run_pid) == {killed.pid: "alive", stopped.pid: "alive"}
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        # at once, whatever its last heartbeat's age: its process is gone
        assert states(run_pid) == {stopped.pid: "alive"}
        assert states(run_pid, "--all")[killed.pid] == "lost"
    finally:
        stop_worker(killed)
        stop_worker(stopped)        # SIGTERM: a clean stop
    assert states(run_pid) == {}
    assert states(run_pid, "--all") == {killed.pid: "lost", stopped.pid: "stopped"}
    text = run_pid("workers", "--all").stdout
    assert "stopped" in text and " ago" in text and "lost" in text
    assert "no live worker" in run_pid("workers").stdout


def test_the_liveness_window_is_a_few_heartbeats():
    assert ALIVE_WITHIN_S <= 4 * BEAT_S < 17
