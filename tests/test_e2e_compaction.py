"""Compaction and overflow recovery through the real `pid run`: a real container, the scripted LLM over HTTP.
(The long and detailed cases run through the loop itself, without Docker: tests/test_compaction.py.)"""
from __future__ import annotations

import json
from typing import Any

import pytest

from pid.compaction import SUMMARIZATION_SYSTEM_PROMPT, SUMMARY_PREFIX
from tests.scripted_llm import ScriptedLLM
from tests.test_compaction import check_calls_have_results, openai_request_tokens, system_text

pytestmark = pytest.mark.docker


class CommandJob:
    """`turns` commands with big outputs, then an answer; a summary when the summariser asks."""

    def __init__(self, turns: int, overflow_from: int | None = None) -> None:
        self.turns, self.overflow_from, self.main_calls, self.summaries = turns, overflow_from, 0, 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if system_text(body).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40]):
            self.summaries += 1
            return {"text": f"## Goal\nCount lines. SUMMARY-{self.summaries}"}
        self.main_calls += 1
        if self.overflow_from is not None and self.main_calls >= self.overflow_from:
            return {"overflow": 16384}
        if self.main_calls > self.turns:
            return {"text": "counted"}
        return {"tool_calls": [{"name": "bash", "arguments": {"command": f"seq {self.main_calls} 1500"}}]}


def options(llm: ScriptedLLM, tmp_path) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--api-key", "sk-test", "--out", str(tmp_path / "out")]


def result_of(tmp_path) -> tuple[dict[str, Any], Any]:
    """(result.json, the job's directory) of the one job run under tmp_path/out (the lines are on stderr)."""
    [job_dir] = list((tmp_path / "out").iterdir())
    return json.loads((job_dir / "result.json").read_text()), job_dir


def test_run_compacts_a_job_that_outgrows_its_window(run_pid, sample_repo, tmp_path):
    model = CommandJob(turns=12)
    with ScriptedLLM(responder=model) as llm:
        res = run_pid("run", "Count the lines.", "--repo", str(sample_repo), "--context-window", "16384",
                      *options(llm, tmp_path))
        requests = list(llm.requests)
    assert res.code == 0, res.stderr
    result, job_dir = result_of(tmp_path)
    assert result["status"] == "completed" and result["turns"] == 13 and result["final_message"] == "counted"
    lines = [json.loads(x) for x in (job_dir / "session.jsonl").read_text().splitlines()]
    compactions = [e for e in lines if e["type"] == "compaction"]
    assert len(compactions) >= 2 and model.summaries >= len(compactions)
    assert "context compacted (context full)" in res.stderr and "-token context window" not in res.stderr   # (given)
    assert "assuming no prices (set --input-price/--output-price" in res.stderr   # (not given: said)
    assert max(openai_request_tokens(r) for r in requests) <= 16384
    main = [r for r in requests if not system_text(r).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40])]
    for body in main:
        check_calls_have_results(body)
    assert main[-1]["messages"][1]["content"].startswith(SUMMARY_PREFIX)
    # the summaries' calls are in the job's usage: more than the main calls' own
    session_usage = sum(e["message"]["usage"]["totalTokens"] for e in lines
                        if e["type"] == "message" and e["message"]["role"] == "assistant")
    assert result["usage"]["total_tokens"] > session_usage


def test_run_that_stays_too_long_for_the_model_ends_context_overflow_exit_1(run_pid, sample_repo, tmp_path):
    model = CommandJob(turns=10, overflow_from=3)
    with ScriptedLLM(responder=model) as llm:
        res = run_pid("run", "Count the lines.", "--repo", str(sample_repo), *options(llm, tmp_path))
    assert res.code == 1, res.stderr
    result, _job_dir = result_of(tmp_path)
    assert result["status"] == "failed" and result["exit_reason"] == "context_overflow"
    assert "too long for the model's context window" in result["error"]
    assert "still refused after compacting" in result["error"]
    assert "context compacted (refused for length)" in res.stderr
    assert "warning: model 'scripted' is not in the model table" in res.stderr
    assert model.summaries == 1 and model.main_calls == 4
