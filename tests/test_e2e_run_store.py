"""`pid run` jobs are in the job store: `list`, `status`, `steer`, `pause` and `cancel` reach a foreground run from
another terminal, and a `pid run` killed with SIGKILL is ended by the next command that sweeps."""
from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import pid_containers
from tests.gate import gated, open_gate
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine


def start_run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pid.cli.main", "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def wait_for_record(run_pid, predicate, timeout: float = 60, env=None) -> dict:
    """The newest job's record (as `pid list --json` prints it) once predicate(record) holds."""
    deadline = time.time() + timeout
    while True:
        listed = run_pid("list", "--json", env=env)
        assert listed.code == 0, listed.stderr
        jobs = listed.json()
        if jobs and predicate(jobs[0]):
            return jobs[0]
        assert time.time() < deadline, f"timed out; last seen: {jobs[:1]}"
        time.sleep(0.3)


def opts(llm: ScriptedLLM, out: Path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--out", str(out)]


def test_a_foreground_run_is_listed_steered_paused_and_resumed_from_another_terminal(run_pid, pid_env, sample_repo,
                                                                                      tmp_path):
    command = gated("sleep 3; echo slow")   # runs until the test has looked, steered and paused (tests/gate.py)
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
              {"text": "first"}, {"text": "second"}]
    with ScriptedLLM(script) as llm:
        proc = start_run(pid_env, tmp_path, "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"))
        try:
            job = wait_for_record(run_pid, lambda r: (r["activity"] or "").startswith("turn 1: running bash"))
            assert (job["kind"], job["status"], job["turns"], job["tool_calls"]) == ("run", "running", 1, 1)
            status = run_pid("status", job["id"])
            assert f"now: turn 1: running bash {command[:30]}" in status.stdout, status.stdout
            assert run_pid("steer", job["id"], "also check the README").code == 0
            assert run_pid("pause", job["id"]).code == 0
            open_gate(job["id"])
            # the command ends (progress reaches the store within 2 s); the pause holds the next model call
            wait_for_record(run_pid, lambda r: command[:30] in (r["last_tool"] or ""))
            time.sleep(1)
            assert len(llm.requests) == 1
            assert "running (paused)" in run_pid("status", job["id"]).stdout
            assert run_pid("follow-up", job["id"], "now summarize").code == 0
            assert run_pid("resume", job["id"]).code == 0
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        requests = list(llm.requests)
    assert proc.returncode == 0, err
    assert out.strip() == "second", (err, [r["messages"][-1] for r in requests])
    assert "also check the README" in json.dumps(requests[1]["messages"][-1])
    assert "now summarize" in json.dumps(requests[2]["messages"][-1])
    listed = run_pid("list", "--status", "completed", "--json").json()
    assert [(r["id"], r["kind"], r["exit_reason"], r["turns"]) for r in listed] == [(job["id"], "run", "stop", 3)]
    assert listed[0]["duration_s"] > 3 and listed[0]["total_usage"]["total_tokens"] > 0
    assert run_pid("list", "--status", "running", "--json").json() == []
    table = run_pid("list").stdout
    assert job["id"] in table and "completed" in table and "stop" in table and "  $0  " in table


def test_a_foreground_run_is_cancelled_from_another_terminal(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 100"}}]}, {"text": "never"}]
    with ScriptedLLM(script) as llm:
        proc = start_run(pid_env, tmp_path, "t", "--repo", str(sample_repo), "--json", *opts(llm, tmp_path / "out"))
        try:
            job = wait_for_record(run_pid, lambda r: (r["activity"] or "").startswith("turn 1: running bash"))
            asked = time.monotonic()
            assert run_pid("cancel", job["id"]).code == 0
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - asked
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert (json.loads(out)["status"], json.loads(out)["exit_reason"]) == ("cancelled", "cancelled")
    assert took < 10, took
    record = run_pid("status", job["id"], "--json").json()
    assert (record["status"], record["exit_reason"]) == ("cancelled", "cancelled")


def test_a_killed_foreground_run_is_ended_by_the_next_command_that_sweeps(run_pid, pid_env, sample_repo, tmp_path):
    tmp = tmp_path / "tmp"   # its TMPDIR: where its snapshot of the repository was (anonymous: nothing stays behind)
    tmp.mkdir()
    env = {**pid_env, "PID_LEASE_S": "2", "TMPDIR": str(tmp)}
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 100"}}],
               "usage": {"prompt_tokens": 1000, "completion_tokens": 50}}]
    with ScriptedLLM(script) as llm:
        proc = start_run(env, tmp_path, "t", "--repo", str(sample_repo), "--input-price", "1",
                         *opts(llm, tmp_path / "out"))
        try:
            job = wait_for_record(run_pid, lambda r: (r["activity"] or "").startswith("turn 1: running bash"),
                                  env=env)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert [c for c in pid_containers() if c.labels.get("pid.job") == job["id"]]   # the orphan is still there
    assert list(tmp.iterdir()) == []
    time.sleep(2.5)                                                                 # its lease lapses
    status = run_pid("status", job["id"], env=env)
    assert "failed" in status.stdout and "client_lost" in status.stdout, status.stdout
    assert "error: the `pid run` process that ran this job" in status.stdout
    record = run_pid("status", job["id"], "--json", env=env).json()
    assert (record["turns"], record["tool_calls"], record["usage"]["input"]) == (1, 1, 1000)
    result = json.loads((tmp_path / "out" / job["id"] / "result.json").read_text())
    assert (result["status"], result["exit_reason"], result["turns"], result["tool_calls"]) == \
        ("failed", "client_lost", 1, 1)
    assert result["usage"]["input"] == 1000 and result["usage"]["cost"] == 0.001
    assert "killed?" in result["error"]
    assert [c for c in pid_containers() if c.labels.get("pid.job") == job["id"]] == []
