"""The worker is quiet: one line when a job starts and one when it ends (no Celery banner, no line per HTTP request);
Ctrl-C lets the running job end, then stops. A Redis broker without its client is a clear error."""
from __future__ import annotations

import pytest

import os
import signal
import time

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine


def test_the_worker_prints_a_line_per_job_and_ctrl_c_lets_the_running_job_end(run_pid, pid_env, sample_repo,
                                                                              tmp_path):
    log = tmp_path / "worker.log"
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 4"}}]}, {"text": "done"}]
    worker = start_worker(pid_env, tmp_path, log)
    try:
        with ScriptedLLM(script) as llm:
            job_id = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                             "--out", str(tmp_path / "out")).stdout.strip()
            deadline = time.time() + 60
            while "running bash" not in run_pid("status", job_id).stdout:
                assert time.time() < deadline, log.read_text()
                time.sleep(0.2)
            os.killpg(worker.pid, signal.SIGINT)       # Ctrl-C in the worker's terminal
            assert worker.wait(timeout=60) == 0, log.read_text()
            assert len(llm.requests) == 2              # the job went on to its end...
        done = run_pid("result", job_id, "--json")
    finally:
        stop_worker(worker)
    assert done.code == 0 and done.json()["final_message"] == "done"   # ...and completed
    text = log.read_text()
    assert "pid worker ready" in text
    assert f"job {job_id} started: t" in text
    assert f"job {job_id} completed (stop) in " in text
    assert "waiting for 1 running job(s) to end" in text
    for noise in ("HTTP Request", "[tasks]", "celery@", "SecurityWarning", "No hostname was supplied"):
        assert noise not in text, text


def test_a_redis_broker_without_its_client_is_a_clear_error(run_pid, pid_env, sample_repo, tmp_path):
    # whether or not redis is installed here, this checkout sees it as missing
    hide = tmp_path / "hide"
    (hide / "redis").mkdir(parents=True)
    (hide / "redis" / "__init__.py").write_text("raise ImportError('no redis here')\n")
    env = {**pid_env, "PID_BROKER_URL": "redis://127.0.0.1:1/0",
           "PYTHONPATH": f"{hide}{os.pathsep}{pid_env['PYTHONPATH']}"}
    for args in (["submit", "t", "--repo", str(sample_repo), "--model", "m"], ["worker"]):
        res = run_pid(*args, env=env, timeout=60)
        assert res.code == 2, res.stderr
        assert res.stderr.strip() == ("pid: error: PID_BROKER_URL=redis://… needs the redis client, which is not "
                                      "installed: pip install 'pid[redis]'")
    # a Redis broker means the Redis store too (worker/store.py: store_url), so `list` needs the client as well...
    res = run_pid("list", env=env)
    assert res.code == 2 and "needs the redis client" in res.stderr
    # ...unless the store is named apart: what needs no broker still works
    local = {**env, "PID_STORE_URL": f"sqlite://{tmp_path}/jobs.db"}
    assert run_pid("list", env=local).code == 0
