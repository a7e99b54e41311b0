"""A container that runs out of memory says so: the kernel's kills (a command's status 137, or pid's own server in
it) come with why, for the model and in the job's ending."""
from __future__ import annotations

from typing import Any

import pytest

from pid.tools.bash import OUT_OF_MEMORY_NOTICE
from tests.scripted_llm import ScriptedLLM
from tests.test_e2e import job_options

pytestmark = pytest.mark.docker

HOG = "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}"   # bash holds it all: the kernel kills bash


def bash(command: str, **turn: Any) -> dict[str, Any]:
    """A scripted model's turn that runs `command`."""
    return {**turn, "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def run_limited(run_pid, repo, llm: ScriptedLLM, out, memory: str, *extra: str):
    """`pid run --json` of the sample task on `repo` under `--memory`, answered by `llm`."""
    return run_pid("run", "t", "--repo", str(repo), "--json", "--memory", memory, *extra, *job_options(llm, out))


def tool_results(llm: ScriptedLLM, request: int) -> list[str]:
    """What the model was told of its calls, as request `request` carried it."""
    return [m["content"] for m in llm.requests[request]["messages"] if m["role"] == "tool"]


def test_a_command_killed_for_memory_tells_the_model_why(run_pid, sample_repo, tmp_path):
    """And only that command, whatever its status (`|| true` hides it): a kill is not blamed on the next failure."""
    script = [
        bash(f"( {HOG} ) || true"),
        bash("echo fine; exit 3"),
        bash(HOG),
        bash("exit 4"),
        {"text": "ok"},
    ]
    with ScriptedLLM(script) as llm:
        res = run_limited(run_pid, sample_repo, llm, tmp_path / "out", "128m")
        assert res.code == 0, res.stderr
        told = tool_results(llm, 4)
    survived, failed, killed, after = told
    assert OUT_OF_MEMORY_NOTICE in survived and not survived.endswith("137"), survived   # (its status is 0)
    assert OUT_OF_MEMORY_NOTICE not in failed + after, told
    assert failed.endswith("Command exited with code 3") and after.endswith("Command exited with code 4"), told
    assert OUT_OF_MEMORY_NOTICE in killed and killed.endswith("Command exited with code 137"), killed


def test_memory_filled_where_no_kill_frees_it_ends_saying_so(run_pid, sample_repo, tmp_path):
    """Pages in /dev/shm cannot be reclaimed: the kernel kills on, pid's own servers too. However the job then
    ends (the call fails, the sandbox is lost, or the patch cannot be made), what the model or the user is told says
    the container ran out of memory, never only that a channel closed."""
    script = [
        bash("head -c 100000000 /dev/zero > /dev/shm/fill"),
        bash("echo after > hello.py"),
        {"text": "ok"},
    ]
    with ScriptedLLM(script) as llm:
        res = run_limited(run_pid, sample_repo, llm, tmp_path / "out", "40m")
        result = res.json()
        told = [m["content"] for request in llm.requests for m in request["messages"] if m["role"] == "tool"]
    said = "\n".join([*told, result.get("error") or ""])
    assert "ran out of memory" in said, (said, res.stderr)
    assert "ran out of memory" in (result.get("error") or "") or result["status"] == "completed", result


def test_a_kill_between_two_commands_is_told_by_the_next(run_pid, sample_repo, tmp_path):
    """A process left running (a server, a build in the background) that the kernel kills while the model thinks:
    the next command's result says the container ran out of memory, once."""
    script = [
        bash(f"( sleep 0.3; {HOG} ) >/dev/null 2>&1 &"),
        bash("echo next", delay_s=3),
        bash("echo then"),
        {"text": "ok"},
    ]
    with ScriptedLLM(script) as llm:
        res = run_limited(run_pid, sample_repo, llm, tmp_path / "out", "128m")
        assert res.code == 0, res.stderr
        told = tool_results(llm, 3)
    started, following, then = told
    assert OUT_OF_MEMORY_NOTICE not in started, started
    assert OUT_OF_MEMORY_NOTICE in following and following.startswith("next"), following
    assert OUT_OF_MEMORY_NOTICE not in then, then


def test_a_check_killed_for_memory_says_so(run_pid, sample_repo, tmp_path):
    """The check's container has the job's limits: a check the kernel killed for memory failed on a limit, which
    may say nothing of the patch. Its record and its line say so (they said `exit 137` alone)."""
    with ScriptedLLM([{"text": "nothing to do"}]) as llm:
        res = run_limited(run_pid, sample_repo, llm, tmp_path / "out", "128m", "--check", HOG)
    check = res.json()["check"]
    assert res.code == 4 and check["passed"] is False and check["out_of_memory"] is True, check
    with ScriptedLLM([{"text": "nothing to do"}]) as llm:
        fine = run_limited(run_pid, sample_repo, llm, tmp_path / "out2", "128m", "--check", "true")
    assert fine.code == 0 and "out_of_memory" not in fine.json()["check"], fine.json()


def test_the_check_line_names_the_memory_limit():
    from pid.cli.output import check_failure
    assert check_failure({"exit_code": 137, "out_of_memory": True}) == \
        "exit 137; the container ran out of memory (--memory)"
    assert check_failure({"exit_code": 1}) == "exit 1"
