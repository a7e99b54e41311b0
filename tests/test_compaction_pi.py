"""The real pi (npm) opens a session pid compacted and continues it: pid's compaction entries are pi's.

pi is installed once into the user's cache, outside the checkout (~/.cache/pid-pi, or $PID_PI_CACHE; docker/setup.sh
--test does it beforehand), or PID_TEST_PI names a pi executable. Without node and npm the test is skipped; a failed
install is a failure."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pid.compaction import SUMMARY_PREFIX
from tests.scripted_llm import ScriptedLLM
from tests.services import missing
from tests.test_compaction import LongJob, entries, run_job

pytestmark = pytest.mark.cli   # a subprocess (node), no engine

PI_PACKAGE = "@mariozechner/pi-coding-agent@0.73.1"   # the version that wrote tests/fixtures/pi-session-v3-sample
PI_PREFIX = Path(os.environ.get("PID_PI_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "pid-pi") / "0.73.1"   # (where docker/setup.sh --test puts it)


def pi_command() -> str:
    given = os.environ.get("PID_TEST_PI")
    if given:
        return given
    installed = PI_PREFIX / "node_modules" / ".bin" / "pi"
    if installed.exists():
        return str(installed)
    if not (shutil.which("node") and shutil.which("npm")):
        missing("node and npm are not installed: the real pi cannot be run "
                "(apt-get install nodejs npm; docker/setup.sh --test does)")
    proc = subprocess.run(["npm", "install", "--prefix", str(PI_PREFIX), "--no-audit", "--no-fund",
                           "--loglevel=error", PI_PACKAGE], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not installed.exists():
        pytest.fail(f"npm install {PI_PACKAGE} failed:\n{proc.stderr[-2000:]}")
    return str(installed)


def test_pi_opens_a_session_pid_compacted_and_continues_from_its_summary(tmp_path):
    pi = pi_command()
    model = LongJob(turns=40)
    with ScriptedLLM(responder=model) as llm:
        outcome, _agent, session_path = run_job(llm, tmp_path)
    assert outcome.status == "completed"
    before = entries(session_path)
    compactions = [e for e in before if e["type"] == "compaction"]
    assert len(compactions) >= 2
    latest = compactions[-1]
    kept = next(e for e in before if e.get("id") == latest["firstKeptEntryId"])

    agent_dir = tmp_path / "pi-agent"
    agent_dir.mkdir()
    with ScriptedLLM([{"text": "pi carried on"}]) as llm:
        (agent_dir / "models.json").write_text(json.dumps({"providers": {"scripted": {
            "baseUrl": llm.base_url, "api": "openai-completions", "apiKey": "sk-test",
            "models": [{"id": "scripted", "contextWindow": 200000, "maxTokens": 4096}]}}}))
        env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent_dir), "HOME": str(tmp_path), "PI_OFFLINE": "1"}
        proc = subprocess.run([pi, "--provider", "scripted", "--model", "scripted", "--session", str(session_path),
                               "--offline", "--no-extensions", "--no-skills", "--no-context-files",
                               "--no-prompt-templates", "--no-themes", "-p", "Carry on from the summary."],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        requests = list(llm.requests)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pi carried on" in proc.stdout
    assert len(requests) == 1    # pi did not need to compact again, nor retry
    messages = requests[0]["messages"]
    # pi's context: its system prompt, the latest summary, the kept messages, then the new prompt
    assert messages[0]["role"] == "system"
    opening = messages[1]["content"]
    opening = opening if isinstance(opening, str) else "".join(part.get("text", "") for part in opening)
    assert opening.startswith(SUMMARY_PREFIX) and latest["summary"] in opening
    assert messages[2]["role"] == kept["message"]["role"] == "assistant"
    assert messages[2]["tool_calls"][0]["id"] == kept["message"]["content"][-1]["id"]
    assert messages[-2]["role"] == "assistant" and messages[-2]["content"] == "all done"
    last_text = messages[-1]["content"]
    assert "Carry on from the summary." in (last_text if isinstance(last_text, str) else json.dumps(last_text))
    # pi appended to the same file, on the same chain
    after = entries(session_path)
    assert after[:len(before)] == before and after[len(before)]["parentId"] == before[-1]["id"]
    assert after[-1]["type"] == "message" and after[-1]["message"]["content"][0]["text"] == "pi carried on"
