"""Nothing lost: a worker SIGKILLed mid-job (the embedded transport loses its in-flight message) does not lose
the job. Its lease lapses, the next worker's sweeper dispatches it again, and it runs to the end exactly once more."""
from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import pid_containers, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from worker.store import JobStore

pytestmark = pytest.mark.docker  # the whole module needs an engine


def test_job_survives_a_killed_worker(run_pid, pid_env, sample_repo, tmp_path):
    env = {**pid_env, "PID_LEASE_S": "2", "PID_SWEEP_S": "1"}
    script = [{"delay_s": 8, "text": "first attempt (never delivered)"}, {"text": "recovered"}]
    with ScriptedLLM(script) as llm:
        first = start_worker(env, tmp_path, tmp_path / "w1.log")
        try:
            res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                          "--out", str(tmp_path / "out"), env=env)
            assert res.code == 0, res.stderr
            job_id = res.stdout.strip()
            deadline = time.time() + 60
            while len(llm.requests) < 1:
                assert time.time() < deadline, (tmp_path / "w1.log").read_text()
                time.sleep(0.1)
            os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool child, mid model call
            first.wait()
            assert [c.labels["pid.job"] for c in pid_containers() if c.labels["pid.job"] == job_id] == [job_id]
        finally:
            stop_worker(first)
        second = start_worker(env, tmp_path, tmp_path / "w2.log")
        try:
            done = run_pid("result", job_id, "--wait", "--json", env=env, timeout=120)
        finally:
            stop_worker(second)
    assert done.code == 0, done.stderr + (tmp_path / "w2.log").read_text()
    assert done.json()["final_message"] == "recovered"
    record = JobStore(os.path.join(env["PID_HOME"], "jobs.db")).get(job_id)
    assert record.status == "completed" and record.attempts == 2
    # the retry removed the orphan of the lost attempt, then its own
    assert [c for c in pid_containers() if c.labels["pid.job"] == job_id] == []
