"""A job's log from its store: `pid logs` (and `-f`, `--json`) shows a running job's tool calls live and what
happened to the job, from any process that shares the store; `submit --wait` prints the same lines."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker


def test_pid_logs_follows_a_running_job_live_and_prints_its_whole_log_after(run_pid, worker, pid_env, sample_repo,
                                                                             tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo one"}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 4; echo two"}}]},
              {"tool_calls": [{"name": "read", "arguments": {"path": "missing.txt"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        job_id = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                         "--out", str(tmp_path / "out")).stdout.strip()
        follower = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "logs", job_id, "-f"], cwd=tmp_path,
                                    env=pid_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            seen = [follower.stdout.readline()]   # live: the first call's line arrives while the second runs
            while "echo one" not in seen[-1]:
                seen.append(follower.stdout.readline())
                assert seen[-1], follower.stderr.read()
            assert len(llm.requests) <= 2, "the first line came only after the job went on"
            rest, err = follower.communicate(timeout=120)
            out = "".join(seen) + rest
        finally:
            follower.kill()
    assert follower.returncode == 0, err
    assert "✓ bash sleep 4; echo two" in out and "✗ read missing.txt" in out
    assert "attempt 1 started on" in out and f"job {job_id} completed (stop)" in out
    whole = run_pid("logs", job_id)
    assert whole.code == 0 and whole.stdout.count("✓ bash") == 2
    records = [json.loads(line) for line in run_pid("logs", job_id, "--json").stdout.splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[0] == "job" and records[0]["status"] == "running"
    assert kinds[-1] == "job" and records[-1]["status"] == "completed"
    assert kinds.count("tool_start") == kinds.count("tool_end") == 3 and kinds.count("turn_start") == 4
    ends = [r for r in records if r["type"] == "tool_end"]
    assert [(r["name"], r["is_error"]) for r in ends] == [("bash", False), ("bash", False), ("read", True)]
    assert ends[1]["duration_s"] >= 4 and "missing.txt" in ends[2]["error_line"]
    assert run_pid("logs", "nope").code == 2


def test_submit_wait_prints_the_tool_calls_from_the_store(run_pid, worker, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("submit", "--wait", "t", "--repo", str(sample_repo), "--model", "m", "--base-url",
                      llm.base_url, "--out", str(tmp_path / "out"))
    assert res.code == 0, res.stderr
    assert "✓ bash echo hi" in res.stderr and "attempt 1 started on" in res.stderr
    assert res.stdout.strip() == "done"


def test_a_failed_tool_s_line_gives_its_reason_and_bash_s_its_ending():
    """An edit's reason is its first line (its last may be a stray line of the text it looked for: `— 3`); a failed
    command's is its last, the exit status."""
    from pid import events as ev
    from pid.event_records import EventRecords
    from pid.messages import TextContent, ToolResultMessage
    records = EventRecords()

    def line(name: str, text: str) -> str:
        records(ev.ToolStart("c", name, {}))
        result = ToolResultMessage("c", name, [TextContent(text)], is_error=True)
        return records(ev.ToolEnd("c", name, result, 0.01))["error_line"]
    assert line("edit", "Could not find the exact text in calc.py. The old text must match exactly.\n\n"
                        "    return a - b\n3") == "Could not find the exact text in calc.py. The old text must match " \
                                                 "exactly."
    assert line("bash", "Traceback (most recent call last):\n  boom\n\nCommand exited with code 1") == \
        "Command exited with code 1"
    assert line("bash", 'Validation failed for tool "bash":\n  - timeout: must be > 0\n\nReceived arguments:\n'
                        '{\n  "command": "ls",\n  "timeout": -1\n}') == "timeout: must be > 0"
    from pid.messages import ToolCall
    from pid.tools.registry import default_registry   # arguments that are no JSON: the reason, not the echo of them
    refused = default_registry().execute(ToolCall("c", "bash", {}, raw_arguments="{not json"), None)  # type: ignore
    assert line("bash", refused.content[0].text).startswith('The arguments for tool "bash" were not valid JSON')
    assert line("bash", "so the tool was not run\nCommand exited with code 1") == "Command exited with code 1"


def test_a_foreground_run_s_log_ends_with_how_it_ended(run_pid, sample_repo, tmp_path):
    """A worker's job's log ends with its end line; a `pid run`'s said nothing of how the job ended (a new user's
    test: a wall clock's job showed only its aborted command)."""
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30"}}]}, {"text": "never"}]
    with ScriptedLLM(script) as llm:
        done = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                       "--out", str(tmp_path / "out"), "--timeout", "3", "--json", timeout=120)
    job_id = done.json()["id"]
    last = run_pid("logs", job_id).stdout.strip().splitlines()[-1]
    assert f"job {job_id} limit (wall_clock) in " in last, last
