"""Nothing lost: a worker SIGKILLed mid-job (the embedded transport loses its in-flight message) does not lose
the job. Its lease lapses, the next worker's sweeper dispatches it again, and it runs to the end exactly once more,
keeping the earlier attempt's transcript and counting what it spent. With no attempt left, the job ends `failed`
with its true counts."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import pid_containers, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.docker  # the whole module needs an engine


def test_job_survives_a_killed_worker(run_pid, pid_env, sample_repo, tmp_path):
    env = {**pid_env, "PID_LEASE_S": "2", "PID_SWEEP_S": "1"}
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}],
               "usage": {"prompt_tokens": 1000, "completion_tokens": 50}},
              {"text": "recovered", "usage": {"prompt_tokens": 20, "completion_tokens": 5}}]
    with ScriptedLLM(script) as llm:
        first = start_worker(env, tmp_path, tmp_path / "w1.log")
        try:
            res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                          "--out", str(tmp_path / "out"), "--input-price", "1", env=env)
            assert res.code == 0, res.stderr
            job_id = res.stdout.strip()
            deadline = time.time() + 60
            while "running bash" not in (run_pid("status", job_id, env=env).stdout):
                assert time.time() < deadline, (tmp_path / "w1.log").read_text()
                time.sleep(0.2)
            os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool child, mid tool call
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
    result = done.json()
    assert result["final_message"] == "recovered"
    record = JobStore(os.path.join(env["PID_HOME"], "jobs.db")).get(job_id)
    assert record.status == "completed" and record.attempts == 2
    # both attempts' tokens and cost count; the first attempt's transcript is kept beside the second's
    assert (result["usage"]["input"], result["usage"]["output"], result["usage"]["cost"]) == (1020, 55, 0.00102)
    assert [(a["attempt"], a["turns"], a["tool_calls"]) for a in result["per_attempt"]] == [(1, 1, 1), (2, 1, 0)]
    job_dir = tmp_path / "out" / job_id
    assert "sleep 60" in (job_dir / "session.attempt-1.jsonl").read_text()
    transcript = (job_dir / "session.jsonl").read_text()
    assert "recovered" in transcript and "sleep 60" not in transcript
    # the retry removed the orphan of the lost attempt, then its own
    assert [c for c in pid_containers() if c.labels["pid.job"] == job_id] == []


def test_a_worker_stopped_cold_with_no_attempt_left_leaves_its_job_failed_with_true_counts(run_pid, pid_env,
                                                                                           sample_repo, tmp_path):
    env = {**pid_env, "PID_LEASE_S": "2", "PID_SWEEP_S": "1", "PID_MAX_ATTEMPTS": "1"}
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}],
               "usage": {"prompt_tokens": 1000, "completion_tokens": 50}}]
    with ScriptedLLM(script) as llm:
        worker = start_worker(env, tmp_path, tmp_path / "w.log")
        try:
            job_id = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                             "--out", str(tmp_path / "out"), env=env).stdout.strip()
            deadline = time.time() + 60
            while "running bash" not in (run_pid("status", job_id, env=env).stdout):
                assert time.time() < deadline, (tmp_path / "w.log").read_text()
                time.sleep(0.2)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        finally:
            stop_worker(worker)
    time.sleep(2.5)   # the lease lapses; no worker runs: the next command's sweep ends the job
    status = run_pid("status", job_id, env=env)
    assert "failed" in status.stdout and "worker_lost" in status.stdout, status.stdout
    assert "error: worker lost 1 time(s)" in status.stdout
    result = json.loads((tmp_path / "out" / job_id / "result.json").read_text())
    assert (result["status"], result["exit_reason"], result["turns"], result["tool_calls"]) == \
        ("failed", "worker_lost", 1, 1)
    assert result["usage"]["input"] == 1000 and "worker lost" in result["error"]
    assert [c for c in pid_containers() if c.labels.get("pid.job") == job_id] == []
