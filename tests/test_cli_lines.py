"""What a `pid run` terminal and `pid logs` say, line by line, through the real CLI against a scripted model: each
line says what happened in words a person reads once (a failed call's reason, not a stray line of its output)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.docker, pytest.mark.cli]


def opts(llm: ScriptedLLM, out: Path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--out", str(out)]


def line_with(text: str, needle: str) -> str:
    found = [line for line in text.splitlines() if needle in line]
    assert found, (needle, text)
    return found[0]


def test_a_failed_edit_s_line_gives_its_reason_in_the_terminal_and_the_log(run_pid, sample_repo, tmp_path):
    # hello.py has no "absent" line: the edit fails with a hint whose last line is a bare line number
    script = [{"tool_calls": [{"name": "edit", "arguments": {"path": "hello.py", "oldText": "absent\n3",
                                                             "newText": "x"}}]},
              {"text": "gave up"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"))
    assert res.code == 0, res.stderr
    line = line_with(res.stderr, "✗ edit hello.py")
    assert "— Could not find the exact text in hello.py" in line, line
    job_id = line_with(res.stderr, "job ").split()[1].rstrip(":")
    logged = line_with(run_pid("logs", job_id).stdout, "✗ edit hello.py")
    assert "— Could not find the exact text in hello.py" in logged, logged


def test_a_closed_stdout_and_stderr_never_end_the_job(pid_env, sample_repo, tmp_path):
    """`pid run … | head`: the reader goes away; the job runs on, ends as it would, and exits with its code."""
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo one"}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "echo two"}}]},
              {"text": "all done\n" * 50}]
    with ScriptedLLM(script) as llm:
        proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "run", "t", "--repo", str(sample_repo),
                                 *opts(llm, tmp_path / "out")], cwd=tmp_path, env=pid_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stderr.readline()          # it started...
        proc.stdout.close()             # ...and nobody reads any more
        proc.stderr.close()
        assert proc.wait(timeout=120) == 0
        assert len(llm.requests) == 3
    [job_dir] = (tmp_path / "out").iterdir()
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["status"], result["final_message"].split()[:2]) == ("completed", ["all", "done"])


def test_ctrl_c_while_pid_run_loads_is_one_line_and_leaves_nothing(pid_env, sample_repo, tmp_path):
    """In its first half second `pid run` is loading its code (and starting its container): a Ctrl-C there is one
    line and exit 130, never a traceback, and no container of this installation stays."""
    import signal
    import time
    from pid.sandbox.config import LABEL_OWNER
    from pid.sandbox.reaper import owner_label
    from tests.conftest import ROOT, pid_containers
    assert subprocess.run([sys.executable, "-m", "pid.cli.main", "--version"], env=pid_env, capture_output=True,
                          timeout=60).returncode == 0   # (its bytecode compiled: that is Python's, not pid's, to do)
    with ScriptedLLM([{"delay_s": 5, "text": "done"}] * 20) as llm:
        for delay in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6):
            proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "run", "t", "--repo", str(sample_repo),
                                     *opts(llm, tmp_path / "out")], cwd=tmp_path, env=pid_env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
            said = [line for line in err.splitlines() if line.strip() and not line.startswith(("job ", "warning: "))]
            pids_code = any(f"{ROOT}/{package}/" in err for package in ("cli", "pid", "jobs", "worker", "sandbox"))
            pids_words = any(line.startswith(("interrupted", "cancelling")) for line in said)
            if not pids_code and not pids_words and (proc.returncode == -signal.SIGINT or "KeyboardInterrupt" in err):
                continue   # Python's own start-up, before the first line of pid's code (a loaded machine's 0.1 s;
                           # in `site`: "Fatal Python error: init_import_site", exit 1)
            assert proc.returncode == 130 and "Traceback" not in err, (delay, proc.returncode, err)
            if said[0].startswith("cancelling"):   # (past its start: the job was cancelled, its summary follows)
                continue
            assert len(said) == 1 and said[0].startswith("interrupted"), (delay, err)
    mine = owner_label(pid_env["PID_HOME"])
    deadline = time.time() + 30
    while [c for c in pid_containers() if c.labels.get(LABEL_OWNER) == mine and c.status != "removing"]:
        assert time.time() < deadline, "a container stayed behind"
        time.sleep(0.2)


def test_the_summary_says_each_thing_once_and_its_cost(run_pid, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}],
               "usage": {"prompt_tokens": 1000, "completion_tokens": 100}},
              {"text": "done", "usage": {"prompt_tokens": 1200, "completion_tokens": 10}}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"), "--check", "true",
                      "--input-price", "3", "--output-price", "15")
    assert res.code == 0, res.stderr
    verdicts = [line for line in res.stderr.splitlines() if "check passed" in line or "✓ check" in line]
    assert len(verdicts) == 1, res.stderr                     # the live line; the summary does not repeat it
    summary = line_with(res.stderr, "completed")
    # 2,200 tokens in at $3 a million, 110 out at $15
    assert summary.startswith("completed (stop) in ") and summary.endswith("· $0.0083"), summary


def test_json_keeps_the_runs_lines_on_stderr_and_stdout_for_the_result(run_pid, pid_env, sample_repo, tmp_path):
    """--json replaces the summary, not the lines as the job runs: a CI log showed nothing through a model's retries
    (a new-user test)."""
    from tests.conftest import start_worker, stop_worker
    script = [{"error": {"status": 500}}, {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        ran = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"), "--json")
        llm.add(*script)
        worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
        try:
            waited = run_pid("submit", "--wait", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out2"),
                             "--json")
        finally:
            stop_worker(worker)
    for res in (ran, waited):
        assert res.code == 0, res.stderr
        assert json.loads(res.stdout)["status"] == "completed"   # (stdout: result.json alone)
        assert "retrying" in res.stderr and "bash echo hi" in res.stderr, res.stderr


def test_an_html_error_page_is_its_status_and_first_line_said_once(run_pid, sample_repo, tmp_path):
    page = ("<!DOCTYPE html>\n<html>\n<head>\n<title>502 Bad Gateway</title>\n<style>body { margin: 0 }</style>\n"
            "</head>\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx/1.18.0</center>\n"
            + "<p>filler</p>\n" * 30 + "</body>\n</html>\n")
    with ScriptedLLM([{"error": {"status": 400, "body": page}}]) as llm:   # (400: said at once, no retries)
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"))
    assert res.code == 1, res.stderr
    said = [line for line in res.stderr.splitlines() if "Bad Gateway" in line]
    assert len(said) == 1 and "HTTP 400 from " in said[0] and "<" not in said[0] and len(said[0]) < 200, res.stderr
    assert "filler" not in res.stderr


def test_pid_run_dash_reads_the_task_from_stdin(pid_env, sample_repo, tmp_path):
    with ScriptedLLM([{"text": "ok"}]) as llm:
        res = subprocess.run([sys.executable, "-m", "pid.cli.main", "run", "-", "--repo", str(sample_repo),
                              *opts(llm, tmp_path / "out")], input="STDIN-TASK-3\nsecond line\n", cwd=tmp_path,
                             env=pid_env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        task = llm.requests[0]["messages"][1]["content"]
    text = task if isinstance(task, str) else "".join(part.get("text", "") for part in task)
    assert text.startswith("STDIN-TASK-3\nsecond line"), text
    empty = subprocess.run([sys.executable, "-m", "pid.cli.main", "run", "-", "--repo", str(sample_repo),
                            *opts(llm, tmp_path / "out")], input="  \n", cwd=tmp_path, env=pid_env,
                           capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and empty.stderr == "pid: error: the task is empty\n", empty.stderr
