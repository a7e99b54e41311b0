"""The spine, end to end: the real CLI, a real container, a real scripted LLM over HTTP, and (for submit) a real
Celery worker on the embedded broker. Checks the patch, the session file and result.json."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine

FOUR_TOOLS_SCRIPT = [
    {"text": "Let me look around.", "tool_calls": [
        {"name": "bash", "arguments": {"command": "ls && cat hello.py"}},
        {"name": "read", "arguments": {"path": "hello.py"}}]},
    {"tool_calls": [
        {"name": "edit", "arguments": {"path": "hello.py",
                                       "edits": [{"oldText": 'print("hello")', "newText": 'print("hello, pid")'}]}},
        {"name": "write", "arguments": {"path": "notes/new.txt", "content": "made by the agent\n"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": "python3 hello.py; git status --short"}}]},
    {"text": "Done: hello.py now greets pid."},
]


def job_options(llm: ScriptedLLM, out: Path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--api-key", "sk-test-secret", "--out", str(out)]


def check_four_tool_job(result: dict, job_dir: Path, llm: ScriptedLLM, repo: Path) -> None:
    assert result["status"] == "completed", result
    assert result["exit_reason"] == "stop"
    assert result["final_message"] == "Done: hello.py now greets pid."
    assert result["turns"] == 4 and result["tool_calls"] == 5
    assert result["usage"]["total_tokens"] > 0
    for key in ("id", "model", "image", "started_at", "finished_at", "duration_s"):
        assert key in result

    # What the model saw: the system prompt with AGENTS.md, four tool schemas, tool results in call order.
    first, third, last = llm.requests[0], llm.requests[2], llm.requests[3]
    assert "MARKER-AGENTS-7f3a" in first["messages"][0]["content"]
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["bash", "edit", "read", "write"]
    tool_msgs = [m for m in third["messages"] if m["role"] == "tool"]
    assert "hello.py" in tool_msgs[0]["content"] and 'print("hello")' in tool_msgs[1]["content"]
    assert "Successfully replaced 1 block(s)" in tool_msgs[2]["content"]
    assert "Successfully wrote 18 bytes" in tool_msgs[3]["content"]
    assert "hello, pid" in [m for m in last["messages"] if m["role"] == "tool"][-1]["content"]

    # The patch: the edit and the new file, against the imported state (uncommitted README change excluded).
    patch = (job_dir / "patch.diff").read_text()
    assert '+print("hello, pid")' in patch and "notes/new.txt" in patch and "README.md" not in patch
    copy = repo.parent / "apply-check"
    subprocess.run(["cp", "-r", str(repo), str(copy)], check=True)
    subprocess.run(["git", "-C", str(copy), "apply", "--check", str(job_dir / "patch.diff")], check=True)

    # The session: pi's version-3 format, chained by parentId.
    lines = [json.loads(line) for line in (job_dir / "session.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["version"] == 3 and lines[0]["cwd"] == "/workspace"
    for prev, entry in zip(lines[1:], lines[2:]):
        assert entry["parentId"] == prev["id"]
    messages = [e["message"] for e in lines if e["type"] == "message"]
    assert [m["role"] for m in messages] == ["user", "assistant", "toolResult", "toolResult", "assistant",
                                            "toolResult", "toolResult", "assistant", "toolResult", "assistant"]
    assert messages[1]["stopReason"] == "toolUse" and messages[-1]["stopReason"] == "stop"
    assert all(not m["isError"] for m in messages if m["role"] == "toolResult")
    assert "+print(\"hello, pid\")" in messages[5]["details"]["diff"]  # the edit's diff, for humans
    # The API key stays in the worker: never in artifacts.
    for artifact in job_dir.iterdir():
        if artifact.is_file():
            assert "sk-test-secret" not in artifact.read_text(errors="replace")
    # The host repository is untouched.
    assert (repo / "hello.py").read_text() == 'print("hello")\n'
    assert not (repo / "notes").exists()


def test_run_drives_all_four_tools_in_a_container(run_pid, sample_repo, tmp_path):
    with ScriptedLLM(FOUR_TOOLS_SCRIPT) as llm:
        res = run_pid("run", "Make hello.py greet pid.", "--repo", str(sample_repo), "--json",
                      "--file", "notes/new.txt", "--file", "/workspace/missing.txt", "--file", "hello.py",
                      *job_options(llm, tmp_path / "out"))
        assert res.code == 0, res.stderr
        result = res.json()
        check_four_tool_job(result, tmp_path / "out" / result["id"], llm, sample_repo)
    collected = tmp_path / "out" / result["id"] / "files"
    assert (collected / "workspace" / "notes" / "new.txt").read_text() == "made by the agent\n"
    assert (collected / "workspace" / "hello.py").read_text() == 'print("hello, pid")\n'
    assert len(result["artifacts"]["files"]) == 2  # a missing file is skipped, not fatal


def test_run_prints_one_line_per_tool_call_and_the_final_message(run_pid, sample_repo, tmp_path):
    with ScriptedLLM(FOUR_TOOLS_SCRIPT) as llm:
        res = run_pid("run", "Make hello.py greet pid.", "--repo", str(sample_repo), *job_options(llm, tmp_path / "o"))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Done: hello.py now greets pid."
    tool_lines = [line for line in res.stderr.splitlines() if line[:1] in ("✓", "✗")]
    assert len(tool_lines) == 5
    first_batch = " | ".join(tool_lines[:2])  # printed as each call finishes, so in either order
    assert "bash ls && cat hello.py" in first_batch and "read hello.py" in first_batch


def test_submit_wait_runs_through_a_real_worker(run_pid, worker, sample_repo, tmp_path):
    with ScriptedLLM(FOUR_TOOLS_SCRIPT) as llm:
        res = run_pid("submit", "--wait", "--json", "Make hello.py greet pid.", "--repo", str(sample_repo),
                      *job_options(llm, tmp_path / "out"))
        assert res.code == 0, res.stderr
        result = res.json()
        check_four_tool_job(result, tmp_path / "out" / result["id"], llm, sample_repo)
    status = run_pid("status", result["id"])
    assert status.code == 0 and "completed" in status.stdout
    again = run_pid("result", result["id"], "--json")
    assert again.code == 0 and again.json()["id"] == result["id"]


def test_submit_without_wait_prints_the_id_and_result_waits(run_pid, worker, sample_repo, tmp_path):
    with ScriptedLLM([{"text": "nothing to do"}]) as llm:
        res = run_pid("submit", "Say hi.", "--repo", str(sample_repo), *job_options(llm, tmp_path / "out"))
        assert res.code == 0, res.stderr
        job_id = res.stdout.strip()
        done = run_pid("result", job_id, "--wait", "--json")
    assert done.code == 0, done.stderr
    assert done.json()["final_message"] == "nothing to do"


def test_bash_timeout_leaves_no_process_in_the_container(run_pid, sample_repo, tmp_path):
    script = [
        {"tool_calls": [{"name": "bash",
                         "arguments": {"command": "sleep 1000 & sleep 999; echo never", "timeout": 1}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "ps -eo pid,pgid,args"}}]},
        {"text": "ok"},
    ]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--json", *job_options(llm, tmp_path / "out"))
        assert res.code == 0, res.stderr
        tool_msgs = [m for m in llm.requests[2]["messages"] if m["role"] == "tool"]
    assert "Command timed out after 1 seconds" in tool_msgs[0]["content"]
    assert "never" not in tool_msgs[0]["content"]
    processes = tool_msgs[1]["content"]
    assert "PGID" in processes and "sleep 1000" not in processes and "sleep 999" not in processes, processes


# -- bad input: one clear line, exit code 2, nothing run --------------------------------------------------------

def test_missing_repo_is_exit_2(run_pid, tmp_path):
    res = run_pid("run", "t", "--repo", str(tmp_path / "nope"), "--model", "m")
    assert res.code == 2
    assert res.stderr.strip() == f"pid: error: repo path does not exist: {tmp_path / 'nope'}"


def test_missing_model_is_exit_2(run_pid, sample_repo):
    res = run_pid("run", "t", "--repo", str(sample_repo))
    assert res.code == 2
    assert res.stderr.strip() == "pid: error: no model configured: pass --model or set PID_MODEL"


def test_missing_image_is_exit_2(run_pid, sample_repo):
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--image", "pid-no-such-image:0",
                  "--base-url", "http://127.0.0.1:9/v1")   # an endpoint of one's own: no key needed
    assert res.code == 2
    assert res.stderr.startswith("pid: error: ") and "pid-no-such-image:0" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_submit_validates_before_queueing(run_pid, tmp_path):
    res = run_pid("submit", "t", "--repo", str(tmp_path / "nope"), "--model", "m")
    assert res.code == 2 and "repo path does not exist" in res.stderr


def test_unknown_job_is_exit_2(run_pid):
    res = run_pid("status", "no-such-job")
    assert res.code == 2 and res.stderr.strip() == \
        "pid: error: no such job: no-such-job (a job's whole id, or its end: its last 4 characters or more)"


def test_unreachable_endpoint_is_a_failed_job(run_pid, sample_repo, tmp_path):
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--out", str(tmp_path / "out"), "--json")
    assert res.code == 1, res.stderr
    result = res.json()
    assert result["status"] == "failed" and result["exit_reason"] == "provider_error"
    assert "127.0.0.1:9" in result["error"]
    assert (tmp_path / "out" / result["id"] / "patch.diff").exists()


def test_max_turns_is_exit_3(run_pid, sample_repo, tmp_path):
    loop = [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}] * 5
    with ScriptedLLM(loop) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--max-turns", "2", "--json",
                      *job_options(llm, tmp_path / "out"))
    assert res.code == 3, res.stderr
    assert res.json()["exit_reason"] == "max_turns" and res.json()["turns"] == 2


def test_wall_clock_timeout_is_exit_3_with_artifacts(run_pid, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "x"}},
                              {"name": "bash", "arguments": {"command": "sleep 60"}}]}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--timeout", "3", "--json",
                      *job_options(llm, tmp_path / "out"))
    assert res.code == 3, res.stderr
    result = res.json()
    assert result["status"] == "limit" and result["exit_reason"] == "wall_clock"
    assert result["duration_s"] < 30
    assert "a.txt" in (tmp_path / "out" / result["id"] / "patch.diff").read_text()


def test_run_against_an_anthropic_compatible_endpoint(run_pid, sample_repo, tmp_path):
    with ScriptedLLM(FOUR_TOOLS_SCRIPT) as llm:
        res = run_pid("run", "Make hello.py greet pid.", "--repo", str(sample_repo), "--api", "anthropic", "--json",
                      *job_options(llm, tmp_path / "out"))
        paths, first = list(llm.paths), llm.requests[0]
        headers = llm.request_headers[0]
    assert res.code == 0, res.stderr
    result = res.json()
    assert result["status"] == "completed" and result["tool_calls"] == 5
    assert set(paths) == {"/v1/messages"}
    assert headers.get("x-api-key") == "sk-test-secret" and "MARKER-AGENTS-7f3a" in json.dumps(first["system"])
    assert '+print("hello, pid")' in (tmp_path / "out" / result["id"] / "patch.diff").read_text()
    lines = (tmp_path / "out" / result["id"] / "session.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["message"]["api"] == "anthropic-messages"


def test_submit_wait_shows_tool_calls_as_the_worker_makes_them(run_pid, worker, sample_repo, tmp_path):
    with ScriptedLLM(FOUR_TOOLS_SCRIPT) as llm:
        res = run_pid("submit", "--wait", "Make hello.py greet pid.", "--repo", str(sample_repo),
                      *job_options(llm, tmp_path / "out"))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Done: hello.py now greets pid."
    tool_lines = [line for line in res.stderr.splitlines() if line[:1] in ("✓", "✗")]
    # A turn's parallel calls show as each ends: the second turn's edit and write, in either order.
    assert len(tool_lines) == 5 and "bash python3 hello.py" in tool_lines[4]
    assert sorted(line.split()[1] for line in tool_lines[2:4]) == ["edit", "write"]


def test_submit_checks_the_image_before_queueing(run_pid, sample_repo):
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--image", "pid-no-such-image:0")
    assert res.code == 2 and "pid-no-such-image:0" in res.stderr
    listed = run_pid("list")
    assert (listed.stdout, listed.stderr) == ("", "no jobs\n")  # nothing was queued, and the empty list says so


def test_a_lone_surrogate_from_the_model_ends_the_job_truly(run_pid, worker, sample_repo, tmp_path):
    """A model (or its error) may send "\\ud800" in JSON: text no UTF-8 file or store can hold. Recording the job's
    end crashed on it (a traceback, a result.json that said `error`, none at all from a worker). It is stored as
    U+FFFD now, and the job ends as the model's reply says."""
    with ScriptedLLM([{"text": "hi \ud800 there"}, {"text": "again \udfff"}]) as llm:
        ran = run_pid("run", "t", "--repo", str(sample_repo), *job_options(llm, tmp_path / "run"), "--json")
        submitted = run_pid("submit", "--wait", "--json", "t", "--repo", str(sample_repo),
                            *job_options(llm, tmp_path / "submit"))
    assert ran.code == 0, ran.stderr
    assert "Traceback" not in ran.stderr and ran.json()["final_message"] == "hi \ufffd there"
    assert submitted.code == 0, submitted.stderr
    assert submitted.json()["status"] == "completed" and submitted.json()["final_message"] == "again \ufffd"
    with ScriptedLLM([{"error": {"status": 400, "message": "bad \ud800 request"}}]) as llm:
        failed = run_pid("run", "t", "--repo", str(sample_repo), *job_options(llm, tmp_path / "run"), "--json")
    assert failed.code == 1 and failed.json()["exit_reason"] == "provider_error", failed.stderr
    assert "bad \ufffd request" in failed.json()["error"]
