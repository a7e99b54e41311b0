"""Issue 21, finding 4, through the real `pid` command: a model's final message, a tool call's arguments, a model
endpoint's error text and a task carry terminal escapes (OSC 52 clipboard, window title, OSC 8 hyperlink, cursor-up
and erase-line drawing a fake "completed", C1 CSI, bidi override); none of it reaches the output of run, result,
status, list, logs or a worker's log, and --json still gives back exactly the original strings."""
from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.scripted_llm import ScriptedLLM
from pid.jobs.sqlite_store import JobStore

pytestmark = [pytest.mark.cli, pytest.mark.docker]   # jobs run in containers

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\"
FAKE_LINE = "\x1b[1A\x1b[2K\r\x1b[32mcompleted\x1b[0m (stop) · check passed"
C1 = "\u009b1A\u009b2K"
BIDI = "invoice_\u202egpj.exe"
FINAL = f"Done.{CLIPBOARD}{TITLE} see {LINK}\n{FAKE_LINE} {C1}{BIDI}"
TASK = f"Fix it{TITLE}\x1b[2J now {BIDI} {CLIPBOARD}"
COMMAND = f"true # {TITLE}{C1}{BIDI}"
SERVER_ERROR = f"quota{CLIPBOARD} exceeded{FAKE_LINE}{C1}{BIDI}{LINK}"
PAYLOADS = ("52;c;", "pwned", "evil.example", "1A", "2K")   # what the escapes carry: none of it is shown


def unsafe(text: str, allow: str = "\n\t") -> list[str]:
    """The characters of `text` a terminal acts on (or that disguise what it shows)."""
    return [hex(ord(c)) for c in text if c not in allow and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


def assert_shown(res: CliResult, *expected: str) -> None:
    for stream in (res.stdout, res.stderr):
        assert unsafe(stream) == [], stream
        for payload in PAYLOADS:
            assert payload not in stream, (payload, stream)
    for text in expected:
        assert text in res.stdout + res.stderr, (text, res.stdout, res.stderr)


def as_json(res: CliResult) -> object:
    assert unsafe(res.stdout, allow="\n") == [], res.stdout
    return json.loads(res.stdout)


def job_args(llm: ScriptedLLM, out: Path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--out", str(out)]


def test_a_hostile_model_and_task_reach_no_terminal(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": COMMAND}}]}, {"text": FINAL}]
    with ScriptedLLM(script) as llm:
        run = run_pid("run", TASK, "--repo", str(sample_repo), *job_args(llm, tmp_path / "out"))
    assert run.code == 0, run.stderr
    assert_shown(run, "Done. see docs", "completed (stop) · check passed invoice_gpj.exe", "✓ bash true #")
    job_id = os.listdir(tmp_path / "out")[0]

    assert_shown(run_pid("result", job_id), "Done. see docs", "invoice_gpj.exe")
    assert_shown(run_pid("status", job_id), "completed")
    assert_shown(run_pid("list"), "Fix it now invoice_gpj.exe")
    assert_shown(run_pid("logs", job_id), "✓ bash true #")
    assert_shown(run_pid("logs", job_id, "--json"))   # the log's own records are kept as they are shown

    assert as_json(run_pid("result", job_id, "--json"))["final_message"] == FINAL
    assert as_json(run_pid("list", "--json"))[0]["task"] == TASK
    assert as_json(run_pid("status", job_id, "--json"))["task"] == TASK


def test_a_model_endpoints_error_text_reaches_no_terminal(run_pid, pid_env, sample_repo, tmp_path):
    with ScriptedLLM([{"error": {"status": 400, "message": SERVER_ERROR}}]) as llm:
        run = run_pid("run", "t", "--repo", str(sample_repo), *job_args(llm, tmp_path / "out"))
    assert run.code == 1, run.stderr
    assert_shown(run, "quota exceeded")
    job_id = os.listdir(tmp_path / "out")[0]
    assert_shown(run_pid("status", job_id), "quota exceeded")
    assert_shown(run_pid("result", job_id), "quota exceeded")
    assert_shown(run_pid("logs", job_id), "quota exceeded")
    stored = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db")).get(job_id)
    assert stored is not None and stored.error and "\x1b]52" in stored.error   # the store keeps the server's words
    assert as_json(run_pid("status", job_id, "--json"))["error"] == stored.error


def test_a_workers_log_shows_a_hostile_task_sanitised(run_pid, worker, sample_repo, tmp_path):
    with ScriptedLLM([{"text": FINAL}]) as llm:
        res = run_pid("submit", "--wait", TASK, "--repo", str(sample_repo), *job_args(llm, tmp_path / "out"))
    assert res.code == 0, res.stderr
    assert_shown(res, "Done. see docs")
    log = (tmp_path / "worker.log").read_text()
    assert "Fix it now invoice_gpj.exe" in log and unsafe(log) == [], log
    assert_shown(run_pid("workers"))
