"""--check CMD: after the agent ends, one command in the job's container decides the job's exit code.

Fast tier: the exit-code table (pid.endings), the output tail, and the runner's order (patch, check, files) on the
in-memory sandbox. Docker tier: a check past its timeout is killed inside the container. CLI tier: `pid run` and
`pid submit --wait` (a real worker) on a small project with a bug, `python3 -m unittest` as the check.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pid import events as ev
from pid.endings import ENDINGS, EXIT_CHECK_FAILED, checks_after, exit_code_for, exit_code_of
from pid.event_records import EventRecords
from pid.sandbox_api import ExecResult, SandboxLost
from tests.memory_sandbox import MemoryProvider, Run
from tests.scripted_llm import ScriptedLLM
from pid.jobs.spec import command_problem
from pid.worker.check import OUTPUT_TAIL_BYTES, OUTPUT_TAIL_LINES, output_tail, run_check
from pid.jobs.spec import JobSpec

FIX = [{"tool_calls": [{"name": "edit", "arguments": {
           "path": "calc.py", "edits": [{"oldText": "return a - b", "newText": "return a + b"}]}}]},
       {"text": "Fixed add()."}]
NO_FIX = [{"text": "I looked and changed nothing."}]
UNITTEST = "python3 -m unittest"


# -- the exit code: one function, pid.endings --------------------------------------------------------------------

@pytest.mark.parametrize("reason, passed, code", [
    ("stop", None, 0), ("stop", True, 0), ("stop", False, EXIT_CHECK_FAILED),
    ("max_turns", None, 3), ("max_turns", True, 3), ("max_turns", False, 3),   # a limit keeps its code
    ("cancelled", False, 1), ("sandbox_error", None, 1), ("artifact_error", True, 1), ("from-the-future", None, 1),
])
def test_the_exit_code_follows_the_reason_and_the_check(reason, passed, code):
    assert exit_code_of(reason, passed) == code
    result = {"exit_reason": reason} if passed is None else {"exit_reason": reason, "check": {"passed": passed}}
    assert exit_code_for(result) == code


def test_a_check_that_says_nothing_readable_has_not_passed():
    assert exit_code_for({"exit_reason": "stop", "check": {"exit_code": 0}}) == EXIT_CHECK_FAILED
    assert exit_code_for({"exit_reason": "stop", "check": "yes"}) == EXIT_CHECK_FAILED


def test_the_check_runs_after_the_agent_s_own_end_and_limits_but_the_wall_clock():
    assert {r for r in ENDINGS if checks_after(r)} == {"stop", "length", "max_turns", "max_cost",
                                                       "consecutive_timeouts"}
    assert not checks_after(None) and not checks_after("wall_clock") and not checks_after("cancelled")


def test_a_check_command_is_refused_when_empty_or_unrunnable():
    assert command_problem(None) is None and command_problem("pytest -q") is None
    assert command_problem("  ") == "the check command is empty"
    assert "NUL" in command_problem("a\0b")


# -- the output tail ---------------------------------------------------------------------------------------------

def _exec(text: bytes, total: int | None = None, lines: int | None = None) -> ExecResult:
    return ExecResult(exit_code=1, tail=text, total_bytes=total if total is not None else len(text),
                      total_lines=lines if lines is not None else text.count(b"\n"))


def test_check_original_takes_paths_not_patterns():
    """A glob was taken as a file of that name and protected nothing, without a word (a new-user test's): the
    agent could then edit the tests that judge it."""
    from pid.jobs.spec import original_paths
    assert original_paths(["tests/test_a.py", "/testbed/tests"], "/testbed") == ["tests/test_a.py", "tests"]
    for pattern in ("tests/*.py", "test_?.py", "tests/[ab].py"):
        with pytest.raises(ValueError, match="a path, not a pattern"):
            original_paths([pattern], "/testbed")


def test_a_check_given_twice_is_refused_not_the_last_one_kept(tmp_path, monkeypatch):
    """`--check 'ruff check .' --check pytest` ran pytest alone, and the gate could pass without ruff; in Python,
    check=["a", "b"] became the command "a,b" (a new-user test)."""
    from click.testing import CliRunner

    import pid
    from pid.cli.main import cli
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(cli, ["submit", "t", "--repo", str(tmp_path), "--model", "m", "--check", "ruff check .",
                                   "--check", "pytest"])
    assert res.exit_code == 2 and "'--check': given 2 times; a job takes one" in " ".join(res.output.split())
    for many in (["ruff check .", "pytest"], []):   # ([] had meant no check at all)
        with pytest.raises(pid.PidError, match="^--check takes one value, a string, not list$"):
            pid.submit("t", repo=tmp_path, model="m", check=many)


def test_a_check_original_path_a_directory_repo_lacks_is_said_before_the_job_runs(buggy, tmp_path):
    """Said at submit, on stderr (a CI gate reading --json saw it only in result.json, after the gate had passed)."""
    from pid.jobs.submission import warn_missing_originals
    said: list[str] = []
    spec = JobSpec(task="t", repo=str(buggy), model="m", out_dir=str(tmp_path / "out"), check=UNITTEST,
                   check_original=["test_calc.py", "tests/test_calc.py"])
    warn_missing_originals(spec, said.append)
    assert said == [f"--check-original tests/test_calc.py: {buggy} has no such path, so the check will see none "
                    "there (right for a file the patch adds; else a misspelt path, which protects nothing)"]
    said.clear()
    warn_missing_originals(JobSpec(task="t", repo="https://example.com/r.git", model="m", out_dir=str(tmp_path),
                                   check=UNITTEST, check_original=["nope"]), said.append)
    assert said == []   # a git URL's workspace is the worker's to look at: the check's result says it


def test_the_output_tail_keeps_the_last_lines_bounded_and_clean():
    many = b"".join(b"line %d\n" % i for i in range(500))
    tail = output_tail(_exec(many))
    assert tail.splitlines() == [f"line {i}" for i in range(500 - OUTPUT_TAIL_LINES, 500)]
    wide = b"".join(b"%04d " % i + b"x" * 300 + b"\n" for i in range(40))
    tail = output_tail(_exec(wide))
    assert len(tail.encode()) <= OUTPUT_TAIL_BYTES and tail.endswith("x") and tail.splitlines()[-1].startswith("0039")
    assert output_tail(_exec(b"\x1b[31mFAILED\x1b[0m (failures=1)\r\n")) == "FAILED (failures=1)"
    # exec's buffer began mid-line: that fragment is dropped
    assert output_tail(_exec(b"ment of a line\nwhole line\n", total=10_000, lines=300)) == "whole line"


# -- the runner, on the in-memory sandbox -------------------------------------------------------------------------

@pytest.fixture
def buggy(tmp_path: Path) -> Path:
    """A small project whose test fails until add() is fixed."""
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
                                       "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    return repo


def _memory_job(repo: Path, tmp_path: Path, script: list, handler, **spec_fields):
    from pid.worker.runner import run_job
    events: list = []
    provider = MemoryProvider(handler)
    with ScriptedLLM(script) as llm:
        spec = JobSpec(task="fix add", repo=str(repo), model="m", out_dir=str(tmp_path / "out"),
                       base_url=llm.base_url, **spec_fields)
        result = run_job(spec, sandboxes=provider, sink=events.append)
    return result, events, provider.created[-1], Path(spec.job_dir)


def test_the_check_runs_on_the_patch_in_a_fresh_sandbox_and_never_reaches_the_patch(buggy, tmp_path):
    """The agent's container goes after its patch and files; the check runs in a new one, on the original workspace
    with the patch applied. What the check writes (a cache, a report) is not in the patch; --file still collects
    the report, from the check's sandbox, since the agent's had none."""
    seen: list[bytes] = []

    def unittest(command, box):
        seen.append(box.files["/workspace/calc.py"])
        box.files["/workspace/__pycache__/calc.cpython-311.pyc"] = b"\0bytecode"
        box.files["/workspace/report.txt"] = b"1 test ok\n"
        return Run("Ran 1 test in 0.001s\n\nOK\n")
    provider = MemoryProvider({UNITTEST: unittest})
    from pid.worker.runner import run_job
    events: list = []
    with ScriptedLLM(FIX) as llm:
        spec = JobSpec(task="fix add", repo=str(buggy), model="m", out_dir=str(tmp_path / "out"),
                       base_url=llm.base_url, check=UNITTEST, files=["report.txt"])
        result = run_job(spec, sandboxes=provider, sink=events.append)
    job_dir = Path(spec.job_dir)
    agent, checked = provider.created
    assert UNITTEST not in agent.commands and agent.closed and checked.closed
    assert checked.commands[-1] == UNITTEST and "git apply" in checked.commands[0]
    assert seen == [b"def add(a, b):\n    return a + b\n"]      # the original, with the patch applied
    check = result["check"]
    assert check == {"command": UNITTEST, "exit_code": 0, "passed": True, "duration_s": check["duration_s"],
                     "output_tail": "Ran 1 test in 0.001s\n\nOK", "timed_out": False, "ran_on": "patch"}
    assert (result["status"], result["exit_reason"], exit_code_for(result)) == ("completed", "stop", 0)
    patch = (job_dir / "patch.diff").read_text()
    assert "+    return a + b" in patch and "report.txt" not in patch and "__pycache__" not in patch
    assert (job_dir / "files" / "workspace" / "report.txt").read_text() == "1 test ok\n"
    assert json.loads((job_dir / "result.json").read_text())["check"] == check
    kinds = [type(e).__name__ for e in events]
    assert kinds[-3:] == ["AgentEnd", "CheckStart", "CheckEnd"]
    records = EventRecords()
    start, end = records(events[-2]), records(events[-1])
    assert start["type"] == "check_start" and start["command"] == UNITTEST
    assert (end["type"], end["passed"], end["exit_code"], end["timed_out"]) == ("check_end", True, 0, False)


def test_the_check_s_files_win_over_the_agent_s_and_the_agent_s_others_are_kept(buggy, tmp_path):
    """A report at the path the check writes could be the agent's forgery: the check's copy is the one delivered.
    A file only the agent's container had (its notes) still comes from there; one neither had is refused."""
    def forge(command, box):
        box.files["/workspace/report.txt"] = b"all 100 tests passed\n"
        box.files["/tmp/notes.md"] = b"what I did\n"
        return Run("")

    def unittest(command, box):
        box.files["/workspace/report.txt"] = b"FAILED (failures=1)\n"
        return Run("FAILED (failures=1)\n", exit_code=1)
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "forge"}}]}, {"text": "Done."}]
    result, _, _, job_dir = _memory_job(buggy, tmp_path, script, {"forge": forge, UNITTEST: unittest},
                                        check=UNITTEST, files=["report.txt", "/tmp/notes.md", "gone.txt"])
    files = job_dir / "files"
    assert (files / "workspace" / "report.txt").read_text() == "FAILED (failures=1)\n"
    assert (files / "tmp" / "notes.md").read_text() == "what I did\n"
    # (by their path in the job's directory, which a download or a batch's item folder keeps)
    assert sorted(result["artifacts"]["files"]) == ["files/tmp/notes.md", "files/workspace/report.txt"]
    assert result["artifacts"]["refused"] == [{"path": "gone.txt", "reason": "not found", "artifact": "files"}]
    assert not (job_dir / ".files-check").exists()


def test_a_directory_the_check_has_replaces_the_agent_s_whole_and_the_files_say_whose_they_are(buggy, tmp_path):
    def forge(command, box):
        box.files["/tmp/out/report.txt"] = b"forged\n"
        box.files["/tmp/out/extra.txt"] = b"the agent's\n"
        box.files["/tmp/notes.md"] = b"notes\n"
        return Run("")

    def unittest(command, box):
        box.files["/tmp/out/report.txt"] = b"real\n"
        return Run("OK\n")
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "forge"}}]}, {"text": "Done."}]
    result, _, _, job_dir = _memory_job(buggy, tmp_path, script, {"forge": forge, UNITTEST: unittest},
                                        check=UNITTEST, files=["/tmp/out/report.txt", "/tmp/out", "/tmp/notes.md"])
    files = job_dir / "files"
    assert (files / "tmp" / "out" / "report.txt").read_text() == "real\n"
    assert not (files / "tmp" / "out" / "extra.txt").exists()      # the check's out/ as a whole
    assert result["artifacts"]["files"] == ["files/tmp/notes.md", "files/tmp/out/report.txt"]
    assert result["artifacts"]["files_from"] == {"agent": ["files/tmp/notes.md"], "check": ["files/tmp/out/report.txt"]}
    assert "refused" not in result["artifacts"]


def test_a_failing_check_keeps_the_agent_s_ending_and_exits_4(buggy, tmp_path):
    failing = Run("F\n", "FAIL: test_add (test_calc.T)\n", "AssertionError: -1 != 5\n", "\nFAILED (failures=1)\n",
                  exit_code=1)
    result, events, _, _ = _memory_job(buggy, tmp_path, NO_FIX, {UNITTEST: failing}, check=UNITTEST)
    assert (result["status"], result["exit_reason"]) == ("completed", "stop")
    assert result["check"]["passed"] is False and result["check"]["exit_code"] == 1
    assert "AssertionError: -1 != 5" in result["check"]["output_tail"]
    assert exit_code_for(result) == EXIT_CHECK_FAILED
    end = EventRecords()(events[-1])
    assert end["passed"] is False and end["error_line"] == "FAILED (failures=1)"


def test_an_empty_final_answer_completes_with_a_warning(buggy, tmp_path):
    from pid.jobs.results import EMPTY_ANSWER
    silent, _, _, _ = _memory_job(buggy, tmp_path / "a", [{"text": ""}], {})
    said, _, _, _ = _memory_job(buggy, tmp_path / "b", NO_FIX, {})
    assert (silent["status"], silent.get("warning")) == ("completed", EMPTY_ANSWER)
    assert said["status"] == "completed" and "warning" not in said


def test_a_limit_hit_is_checked_and_keeps_exit_code_3(buggy, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}]
    result, _, box, _ = _memory_job(buggy, tmp_path, script, {"ls": Run("calc.py\n"), UNITTEST: Run("OK\n")},
                                    check=UNITTEST, max_turns=1)
    assert result["exit_reason"] == "max_turns" and box.commands == [UNITTEST]   # (no patch: nothing to apply)
    assert result["check"]["passed"] is True and exit_code_for(result) == 3


def test_no_check_without_one_nor_after_a_cancel(buggy, tmp_path):
    result, events, box, _ = _memory_job(buggy, tmp_path, NO_FIX, {})
    assert "check" not in result and box.commands == []
    assert not any(isinstance(e, (ev.CheckStart, ev.CheckEnd)) for e in events)
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep"}}]}, {"text": "never"}]
    from pid.worker.runner import run_job
    cancel = threading.Event()
    with ScriptedLLM(script) as llm:
        spec = JobSpec(task="t", repo=str(buggy), model="m", out_dir=str(tmp_path / "o2"), base_url=llm.base_url,
                       check=UNITTEST)
        def cancelled_once_running(command: str, box) -> Run:   # not on a timer a slow start-up can outlast
            cancel.set()
            return Run(30.0)
        provider = MemoryProvider({"sleep": cancelled_once_running, UNITTEST: Run("OK\n")})
        result = run_job(spec, sandboxes=provider, cancel=cancel)
    assert result["exit_reason"] == "cancelled" and "check" not in result
    assert provider.created[0].commands == ["sleep"]


def cancelled_once_started(cancel: threading.Event, run: Run):
    """The check's command: `cancel` is set as it starts (the job is cancelled while its check runs), then it runs."""
    def handler(command, box):
        cancel.set()
        return run
    return handler


def test_a_cancel_while_the_check_runs_cancels_the_job(buggy, tmp_path):
    from pid.worker.runner import run_job
    cancel = threading.Event()
    with ScriptedLLM(NO_FIX) as llm:
        spec = JobSpec(task="t", repo=str(buggy), model="m", out_dir=str(tmp_path / "o"), base_url=llm.base_url,
                       check=UNITTEST)
        provider = MemoryProvider({UNITTEST: cancelled_once_started(cancel, Run("running\n", 30.0))})
        started = time.monotonic()
        result = run_job(spec, sandboxes=provider, cancel=cancel)
    assert time.monotonic() - started < 10
    assert result["exit_reason"] == "cancelled" and result["error"] == "cancelled while the check ran"
    assert result["check"]["cancelled"] is True and result["check"]["passed"] is False
    assert exit_code_for(result) == 1


def test_a_worker_stopping_while_the_check_runs_leaves_the_job_to_the_queue(buggy, tmp_path):
    """Its relay cancels, and the job is no longer this attempt's: no result is written (the task hands it back)."""
    from pid.worker.runner import run_job
    cancel = threading.Event()
    asked: list[bool] = []

    def still_owner() -> bool:
        asked.append(not cancel.is_set())
        return asked[-1]
    with ScriptedLLM(NO_FIX) as llm:
        spec = JobSpec(task="t", repo=str(buggy), model="m", out_dir=str(tmp_path / "o"), base_url=llm.base_url,
                       check=UNITTEST, files=["calc.py"])
        result = run_job(spec, sandboxes=MemoryProvider({UNITTEST: cancelled_once_started(cancel, Run(30.0))}),
                         cancel=cancel, still_owner=still_owner)
    assert asked == [True, False] and result["check"]["cancelled"] is True
    assert not Path(spec.job_dir, "result.json").exists()   # (the files came before the check, from the agent's)


def test_a_check_the_sandbox_could_not_run_fails_the_job(buggy, tmp_path):
    def gone(command, box):
        raise SandboxLost("the sandbox container is gone")
    result, events, _, _ = _memory_job(buggy, tmp_path, NO_FIX, {UNITTEST: gone}, check=UNITTEST)
    assert (result["status"], result["exit_reason"]) == ("failed", "sandbox_error")
    assert result["check"]["passed"] is False and "gone" in result["check"]["error"]
    assert exit_code_for(result) == 1
    # `pid logs` says it could not run (it said "killed": nothing was)
    from pid.cli.output import RecordPrinter
    records, lines = EventRecords(), []
    printer = RecordPrinter(out=lambda *parts, **_: lines.append("".join(map(str, parts))))
    for record in filter(None, map(records, events)):
        printer(record)
    assert any("could not run: the sandbox container is gone" in line for line in lines), lines


def test_a_patch_the_check_cannot_apply_is_the_patch_s_failure_not_the_sandbox_s(buggy, tmp_path, monkeypatch):
    """(An agent that un-ignores and edits an ignored file makes such a patch, a known limit: it ended sandbox_error,
    "the container failed", a new user's test.) Nothing was checked: the job ends artifact_error, and says why."""
    from pid.jobs.continuation import Refused
    from pid.worker import job_check

    def refuse(box, patch, original, whose):
        raise Refused(f"{whose} does not apply to its snapshot: error: config.ini: already exists in working directory")
    monkeypatch.setattr(job_check, "apply_patch", refuse)
    ran: list[str] = []
    result, _, _, _ = _memory_job(buggy, tmp_path, NO_FIX, {UNITTEST: lambda command, box: ran.append(command)},
                                  check=UNITTEST)
    assert (result["status"], result["exit_reason"]) == ("failed", "artifact_error") and ran == []
    assert result["error"] == ("the check could not judge the patch: the job's patch does not apply to its snapshot: "
                               "error: config.ini: already exists in working directory")
    assert result["check"]["passed"] is False and exit_code_for(result) == 1


# -- a real container ---------------------------------------------------------------------------------------------

@pytest.mark.docker
def test_a_check_past_its_timeout_is_killed_inside_the_container(docker_sandbox):
    started = time.monotonic()
    check = run_check(docker_sandbox, "echo started; sleep 301; echo never", timeout_s=1.5)
    assert time.monotonic() - started < 15
    assert check.timed_out and not check.passed and check.exit_code is None
    assert check.output_tail == "started"
    ps = docker_sandbox.exec("ps -eo args", timeout=30)
    assert b"sleep 301" not in ps.tail, ps.tail.decode()


# -- the real CLI ------------------------------------------------------------------------------------------------

def _options(llm: ScriptedLLM, out: Path, repo: Path, *extra: str) -> list[str]:
    return ["fix add()", "--repo", str(repo), "--model", "scripted", "--base-url", llm.base_url, "--out", str(out),
            *extra]


@pytest.mark.docker
@pytest.mark.cli
def test_pid_run_exits_0_when_the_agent_fixes_the_bug_and_4_when_it_does_not(run_pid, buggy, tmp_path):
    with ScriptedLLM(FIX) as llm:
        res = run_pid("run", *_options(llm, tmp_path / "out", buggy, "--check", UNITTEST))
    assert res.code == 0, res.stderr
    # the verdict once: its live line (the summary does not say it again)
    assert res.stderr.count("✓ check python3 -m unittest") == 1 and "check passed" not in res.stderr
    job_dir = next((tmp_path / "out").iterdir())
    result = json.loads((job_dir / "result.json").read_text())
    check = result["check"]
    assert (check["passed"], check["exit_code"], check["timed_out"]) == (True, 0, False)
    assert "Ran 1 test" in check["output_tail"] and check["output_tail"].endswith("OK")
    # The check's bytecode cache is not the agent's change: the patch holds calc.py alone, and applies.
    patch = (job_dir / "patch.diff").read_text()
    assert "+    return a + b" in patch and "__pycache__" not in patch and "pyc" not in patch
    assert subprocess.run(["git", "apply", "--check", str(job_dir / "patch.diff")], cwd=buggy).returncode == 0

    with ScriptedLLM(NO_FIX) as llm:
        res = run_pid("run", "--json", *_options(llm, tmp_path / "out2", buggy, "--check", UNITTEST))
    assert res.code == EXIT_CHECK_FAILED, res.stderr
    result = res.json()
    assert (result["status"], result["exit_reason"]) == ("completed", "stop")
    assert result["check"]["passed"] is False and result["check"]["exit_code"] == 1
    assert "AssertionError: -1 != 5" in result["check"]["output_tail"]
    assert "FAILED (failures=1)" in result["check"]["output_tail"]


@pytest.mark.docker
@pytest.mark.cli
def test_a_check_original_path_the_workspace_lacks_is_said(run_pid, buggy, tmp_path):
    """`--check-original tests/test_calc.py` for a test at the top: it protected nothing, and said nothing."""
    with ScriptedLLM(FIX) as llm:
        res = run_pid("run", "--json", *_options(llm, tmp_path / "out", buggy, "--check", UNITTEST,
                                                 "--check-original", "test_calc.py", "--check-original",
                                                 "tests/test_calc.py"))
    assert res.code == 0, res.stderr
    check = res.json()["check"]
    assert (check["original"], check["original_missing"]) == (["test_calc.py", "tests/test_calc.py"],
                                                              ["tests/test_calc.py"])
    # before the job (the repository is here to look at), and after it from the check's own look (a CI gate that
    # reads the JSON has both in its log)
    assert f"pid: warning: --check-original tests/test_calc.py: {buggy} has no such path" in res.stderr, res.stderr
    assert "warning: --check-original tests/test_calc.py: not in the original workspace" in res.stderr, res.stderr


@pytest.mark.docker
@pytest.mark.cli
def test_pid_run_a_check_past_its_timeout_fails_the_job(run_pid, buggy, tmp_path):
    with ScriptedLLM(FIX) as llm:
        started = time.monotonic()
        res = run_pid("run", *_options(llm, tmp_path / "out", buggy, "--check", "echo checking; sleep 300",
                                       "--check-timeout", "2"))
    assert res.code == EXIT_CHECK_FAILED, res.stderr
    assert time.monotonic() - started < 60
    verdict = next(line for line in res.stderr.splitlines() if line.startswith("✗ check echo checking"))
    assert "— timed out" in verdict and "check output, its last lines:\n  checking" in res.stderr
    result = json.loads(next((tmp_path / "out").iterdir()).joinpath("result.json").read_text())
    assert result["check"]["timed_out"] is True and result["check"]["exit_code"] is None
    assert 2 <= result["check"]["duration_s"] < 30


@pytest.mark.cli
def test_an_empty_check_is_bad_input(run_pid, buggy, tmp_path):
    res = run_pid("run", "t", "--repo", str(buggy), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--check", " ")
    assert res.code == 2 and res.stderr.strip() == "pid: error: --check: the check command is empty", res.stderr


@pytest.mark.docker
@pytest.mark.cli
def test_submit_wait_is_a_ci_gate_and_the_store_has_the_check(run_pid, worker, buggy, tmp_path):
    with ScriptedLLM(NO_FIX) as llm:
        res = run_pid("submit", "--wait", *_options(llm, tmp_path / "out", buggy, "--check", UNITTEST))
    assert res.code == EXIT_CHECK_FAILED, res.stderr
    verdict = next(line for line in res.stderr.splitlines() if line.startswith("✗ check python3 -m unittest"))
    assert "— exit 1" in verdict and "AssertionError: -1 != 5" in res.stderr   # the live log's line, the output
    summary = next(line for line in res.stderr.splitlines() if line.startswith("completed (stop)"))
    assert summary.startswith("completed (stop), check FAILED (exit 1) in "), summary   # the last line says it too
    assert res.stderr.count("check FAILED") == 1                # (the verdict's own line is not repeated)
    job_id = next((tmp_path / "out").iterdir()).name

    status = run_pid("status", job_id, "--json")
    record = status.json()
    assert record["status"] == "completed" and record["exit_code"] == EXIT_CHECK_FAILED
    assert record["check"]["passed"] is False and "AssertionError" in record["check"]["output_tail"]
    assert "check FAILED" in run_pid("status", job_id).stdout
    listed = run_pid("list", "--json").json()
    assert [(r["id"], r["exit_code"], r["check"]["passed"]) for r in listed] == [(job_id, 4, False)]
    assert "stop ✗check" in run_pid("list").stdout
    again = run_pid("result", job_id, "--json")
    assert again.code == EXIT_CHECK_FAILED and again.json()["check"] == record["check"]
    logged = [json.loads(line) for line in run_pid("logs", job_id, "--json").stdout.splitlines()]
    assert [r["type"] for r in logged if r["type"].startswith("check")] == ["check_start", "check_end"]

    with ScriptedLLM(FIX) as llm:
        res = run_pid("submit", "--wait", "--json", *_options(llm, tmp_path / "out", buggy, "--check", UNITTEST))
    assert res.code == 0, res.stderr
    assert res.json()["check"]["passed"] is True


@pytest.mark.docker
@pytest.mark.cli
def test_pid_run_removes_the_check_s_sandbox_when_the_patch_cannot_be_made(run_pid, buggy, tmp_path):
    """The check's sandbox starts while the patch is made; a patch over --max-patch leaves it unused. `pid run` ended
    before the thread making it did, and its container ran on until its time to live (a new-user test's)."""
    from tests.conftest import pid_containers
    with ScriptedLLM(FIX) as llm:
        res = run_pid("run", "--json", *_options(llm, tmp_path / "out", buggy, "--check", UNITTEST, "--max-patch",
                                                 "10"))
    assert res.code == 1 and res.json()["exit_reason"] == "artifact_error", res.stdout + res.stderr
    job_id = res.json()["id"]
    assert [c.name for c in pid_containers() if c.labels.get("pid.job", "").startswith(job_id)] == []
