"""Batches: a worker with --concurrency 2 runs two jobs at once, each in its own process and container."""
from __future__ import annotations

from datetime import datetime

import pytest

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine


def test_two_jobs_run_concurrently_and_both_finish(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 3"}}]}, {"text": "done"}]
    worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log", concurrency=2)
    try:
        with ScriptedLLM(script) as a, ScriptedLLM(script) as b:
            ids = [run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                           "--out", str(tmp_path / "out")).stdout.strip() for llm in (a, b)]
            results = [run_pid("result", job_id, "--wait", "--json", timeout=120) for job_id in ids]
    finally:
        stop_worker(worker)
    assert [r.code for r in results] == [0, 0], [r.stderr for r in results]
    first, second = (r.json() for r in results)
    start = [datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")) for r in (first, second)]
    end = [datetime.fromisoformat(r["finished_at"].replace("Z", "+00:00")) for r in (first, second)]
    assert start[1] < end[0] and start[0] < end[1]  # their runs overlapped
