"""Flow control end to end: `pid cancel`, `pause`/`resume`, `steer` and `follow-up` reaching a job that a real
worker runs, and the tool behaviours the model sees through `pid run` (active subset, notices, images)."""
from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from tests.gate import REACHED, gated, open_gate, reached
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine


def opts(llm: ScriptedLLM, out: Path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--out", str(out)]


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def session_messages(job_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (job_dir / "session.jsonl").read_text().splitlines()]
    return [e["message"] for e in lines if e["type"] == "message"]


def test_cancel_of_a_running_job_ends_it_with_artifacts(run_pid, worker, sample_repo, tmp_path):
    command = f"touch {REACHED}; sleep 100; echo slept"
    script = [{"tool_calls": [{"name": "write", "arguments": {"path": "partial.txt", "content": "so far\n"}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
              {"text": "never"}]
    with ScriptedLLM(script) as llm:
        job_id = run_pid("submit", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out")).stdout.strip()
        wait_until(lambda: len(llm.requests) >= 2 and reached(job_id), what="the sleep to run")
        assert run_pid("cancel", job_id).code == 0
        done = run_pid("result", job_id, "--wait", "--json")
    assert done.code == 1
    result = done.json()
    assert (result["status"], result["exit_reason"]) == ("cancelled", "cancelled")
    job_dir = tmp_path / "out" / job_id
    assert "partial.txt" in (job_dir / "patch.diff").read_text()
    killed = session_messages(job_dir)[-1]
    assert killed["role"] == "toolResult"  # the killed command's result is recorded
    assert "slept" not in json.dumps(killed["content"])   # ended by the cancel, not by itself 100 s later


def test_steer_and_follow_up_reach_a_running_job_in_order(run_pid, worker, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": gated("echo slow")}}]},
              {"text": "first done"}, {"text": "second done"}]
    with ScriptedLLM(script) as llm:
        job_id = run_pid("submit", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out")).stdout.strip()
        wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
        assert run_pid("steer", job_id, "also check the README").code == 0
        assert run_pid("follow-up", job_id, "now summarize").code == 0
        open_gate(job_id)   # the command ends only now: both were sent while it ran
        done = run_pid("result", job_id, "--wait", "--json")
        requests = list(llm.requests)
    assert done.code == 0, done.stderr
    assert done.json()["final_message"] == "second done"
    second, third = requests[1]["messages"], requests[2]["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert second[-2]["content"].strip() == "slow" and "also check the README" in str(second[-1]["content"])
    assert "now summarize" in str(third[-1]["content"])
    users = [m for m in session_messages(tmp_path / "out" / job_id) if m["role"] == "user"]
    assert [u["content"][0]["text"] for u in users] == ["t", "also check the README", "now summarize"]
    late = run_pid("steer", job_id, "too late")
    assert late.code == 2 and "completed" in late.stderr


def test_pause_holds_a_job_and_resume_continues_it(run_pid, worker, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": gated("true")}}]}, {"text": "resumed"}]
    with ScriptedLLM(script) as llm:
        job_id = run_pid("submit", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out")).stdout.strip()
        wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
        assert run_pid("pause", job_id).code == 0
        open_gate(job_id)   # the command ends only now: the pause was sent while it ran
        wait_until(lambda: "← pause received" in run_pid("logs", job_id).stdout, what="the pause to take hold")
        assert len(llm.requests) == 1  # held before its next model call
        status = run_pid("status", job_id)
        assert "running (paused)" in status.stdout
        again = run_pid("pause", job_id)   # asked twice: no error, and no claim that it did anything
        assert again.code == 0 and again.stdout.strip() == f"{job_id}: already paused", again.stdout
        assert run_pid("resume", job_id).code == 0
        done = run_pid("result", job_id, "--wait", "--json")
    assert done.code == 0 and done.json()["final_message"] == "resumed"


PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAA"
                       "ABJRU5ErkJggg==")


def test_tool_subset_and_notices_as_the_model_sees_them(run_pid, sample_repo, tmp_path):
    (sample_repo / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 2501)))
    (sample_repo / "picture.txt").write_bytes(PNG)
    script = [{"tool_calls": [
        {"name": "read", "arguments": {"path": "big.txt"}},
        {"name": "bash", "arguments": {"command": "seq 1 3000"}},
        {"name": "write", "arguments": {"path": "x", "content": "y"}},
        {"name": "read", "arguments": {"path": "@picture.txt"}},
        {"name": "bash", "arguments": {"command": "echo", "timeout": 100000}}]},
        {"text": "seen"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--tools", "read,bash", "--json",
                      *opts(llm, tmp_path / "out"))
        first, second = llm.requests[0], llm.requests[1]
    assert res.code == 0, res.stderr
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["bash", "read"]
    system = first["messages"][0]["content"]
    assert "- read:" in system and "- bash:" in system and "- edit:" not in system and "- write:" not in system
    read_big, seq, write, image, bad_timeout = tool_results(second)
    # pi 0.8x: the final newline ends line 2500 and starts no 2501st
    assert read_big.endswith("line 2000\n\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]")
    assert seq.startswith("1001\n") and "[Showing lines 1001-3000 of 3000. Full output: /.pid/out/" in seq
    assert write == "Tool write not found"
    assert "Read image file [image/png]" in image
    images = [part for m in second["messages"] if m["role"] == "user" and isinstance(m["content"], list)
              for part in m["content"] if part.get("type") == "image_url"]
    assert images and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert bad_timeout.startswith('Validation failed for tool "bash":\n  - timeout:')


def test_text_only_models_get_a_note_instead_of_the_image(run_pid, sample_repo, tmp_path):
    (sample_repo / "shot.png").write_bytes(PNG)
    script = [{"tool_calls": [{"name": "read", "arguments": {"path": "shot.png"}}]}, {"text": "ok"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--no-images", *opts(llm, tmp_path / "out"))
        body = json.dumps(llm.requests[1])
    assert res.code == 0, res.stderr
    assert "image_url" not in body and "this model cannot see images" in body


def test_max_cost_needs_prices(run_pid, sample_repo):
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--max-cost", "1")
    assert res.code == 2 and "--input-price" in res.stderr


def test_cancel_of_a_queued_job_writes_its_result(run_pid, sample_repo, tmp_path):
    # no worker runs: the job stays queued until cancelled
    job_id = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                     "--out", str(tmp_path / "out")).stdout.strip()
    assert "queued" in run_pid("status", job_id).stdout
    assert run_pid("cancel", job_id).stdout.strip() == f"{job_id}: cancelled"
    done = run_pid("result", job_id, "--json")
    assert done.code == 1 and done.json()["status"] == "cancelled"
    assert (tmp_path / "out" / job_id / "result.json").exists()


def test_edit_and_read_behaviours_as_the_model_sees_them(run_pid, sample_repo, tmp_path):
    (sample_repo / "quotes.py").write_bytes('msg = “smart”  \r\nkeep = 1\r\n'.encode())
    (sample_repo / "wide.txt").write_text("".join(f"{i:04d} " + "w" * 205 + "\n" for i in range(500)))
    script = [{"tool_calls": [
        {"name": "edit", "arguments": {"path": "quotes.py",
                                       "edits": [{"oldText": 'msg = "smart"', "newText": "msg = 'plain'"}]}},
        {"name": "read", "arguments": {"path": "wide.txt"}},
        {"name": "edit", "arguments": {"path": "hello.py", "oldText": "absent text", "newText": "x"}},
        {"name": "bash", "arguments": {"command": "echo out; exit 4"}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "od -c quotes.py | head -3"}}]},
        {"text": "checked"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--json", *opts(llm, tmp_path / "out"))
        edited, wide, missing, failed = tool_results(llm.requests[1])
    assert res.code == 0, res.stderr
    assert edited == "Successfully replaced 1 block(s) in quotes.py."
    # 211-byte lines
    assert wide.endswith("\n\n[Showing lines 1-242 of 500 (50.0KB limit). Use offset=243 to continue.]")
    assert missing.startswith("Could not find the exact text in hello.py. The old text must match exactly")
    assert failed == "out\n\n\nCommand exited with code 4"
    patch = (tmp_path / "out" / res.json()["id"] / "patch.diff").read_bytes()
    # matched through smart quotes; CRLF and the bytes around the match kept; the other line is untouched context
    assert patch.endswith(b"-msg = \xe2\x80\x9csmart\xe2\x80\x9d  \r\n+msg = 'plain'  \r\n keep = 1\r\n")
