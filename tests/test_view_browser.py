"""`pid view` in a real browser (Debian's headless Chromium): the pages load without a console message, every tool
call of the transcript is in the DOM, injected scripts do not run, the index sorts, screenshots are saved; and a
real job, run end to end with the scripted model server, viewed by directory and by id."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from tests import chromium
from tests.scripted_llm import ScriptedLLM
from tests.view_fixtures import (BATCH_ITEMS, HOSTILE_CALL_IDS, PWNED_ATTR, hostile_result, hostile_session,
                                 write_batch, write_job)

pytestmark = pytest.mark.cli   # the real `pid` command and a browser, as subprocesses


def tool_calls_in(dom: str) -> list[str]:
    """The tool-call ids of the DOM's transcript, in order (attribute values, HTML-unescaped)."""
    return [html.unescape(v) for v in re.findall(r'data-tool-call="([^"]*)"', dom)]


def test_the_console_check_catches_errors(tmp_path):
    """The harness itself: a page with a script error and a blocked inline script is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><meta http-equiv=\"Content-Security-Policy\" content=\"script-src 'none'\">"
                    "<p>x</p><script>nosuch()</script>")
    assert chromium.dump_dom(page).console, "a CSP violation must show"
    page.write_text("<!doctype html><p>x</p><script>nosuch()</script>")
    assert any("Uncaught" in m for m in chromium.dump_dom(page).console)


def test_a_hostile_job_page_in_chromium(run_pid, tmp_path):
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    res = run_pid("view", str(job), "-o", str(tmp_path / "job.html"))
    assert res.code == 0, res.stderr
    page = Path(res.stdout.strip())
    load = chromium.dump_dom(page)
    assert load.console == []
    assert tool_calls_in(load.dom) == HOSTILE_CALL_IDS
    assert PWNED_ATTR not in load.dom and "<img" not in load.dom
    assert load.dom.count("<script") == 0
    shot = chromium.screenshot(page, tmp_path / "job.png")
    assert shot.console == []


def test_a_batch_index_in_chromium_sorts_and_links(run_pid, tmp_path):
    batch = write_batch(tmp_path / "batch")
    res = run_pid("view", str(batch))
    assert res.code == 0, res.stderr
    index = Path(res.stdout.strip())
    assert index == batch / "view" / "index.html"
    load = chromium.dump_dom(index)
    assert load.console == []
    assert len(re.findall(r'<tr data-id="', load.dom)) == len(BATCH_ITEMS) + 1
    # The page's script sorts the table in the browser: by cost, descending, from the address's fragment.
    by_cost = chromium.dump_dom(index, "#sort=cost-desc")
    assert by_cost.console == []
    rows = re.findall(r'<tr data-id="([^"]*)"', by_cost.dom)
    expected = [i for i, *_ in sorted(BATCH_ITEMS, key=lambda item: -item[3])]
    assert [html.unescape(r) for r in rows] == expected + ["never-ran"]   # no cost: last
    assert 'aria-sort="descending"' in by_cost.dom
    links = re.findall(r'<a href="([^"]+\.html)"', load.dom)
    assert len(links) == len(BATCH_ITEMS) and all((index.parent / name).is_file() for name in links)
    item = chromium.dump_dom(index.parent / "proj-b-2.html")   # one item's page (the renderer's tests check all)
    assert item.console == [] and tool_calls_in(item.dom) == ["call_1_a", "call_1_b"]
    chromium.screenshot(index, tmp_path / "batch.png", "#sort=duration_s-desc")


SCRIPT = [
    {"text": "Let me look around.", "tool_calls": [
        {"name": "bash", "arguments": {"command": "ls && cat hello.py"}},
        {"name": "read", "arguments": {"path": "hello.py"}}]},
    {"thinking": "Now the edit. </details><script>x()</script>", "tool_calls": [
        {"name": "edit", "arguments": {"path": "hello.py",
                                       "edits": [{"oldText": 'print("hello")', "newText": 'print("hello, pid")'}]}},
        {"name": "write", "arguments": {"path": "notes/new.txt", "content": "<script>alert(1)</script>\n"}}]},
    {"text": "Done: hello.py now greets pid."},
]


@pytest.mark.docker
def test_a_real_job_viewed_by_directory_and_by_id(run_pid, sample_repo, tmp_path):
    with ScriptedLLM(SCRIPT) as llm:
        res = run_pid("run", "Make hello.py greet pid.", "--repo", str(sample_repo), "--json", "--model", "scripted",
                      "--base-url", llm.base_url, "--api-key", "sk-test", "--out", str(tmp_path / "out"))
    assert res.code == 0, res.stderr
    job_id = res.json()["id"]
    job_dir = tmp_path / "out" / job_id
    session = [json.loads(line) for line in (job_dir / "session.jsonl").read_text().splitlines()]
    call_ids = [b["id"] for e in session if e.get("type") == "message" and e["message"]["role"] == "assistant"
                for b in e["message"]["content"] if b["type"] == "toolCall"]
    assert len(call_ids) == 4

    by_dir = run_pid("view", str(job_dir))
    assert by_dir.code == 0, by_dir.stderr
    assert Path(by_dir.stdout.strip()) == tmp_path / f"pid-view-{job_id}.html"   # the default: here, named by id
    assert tool_calls_in((tmp_path / f"pid-view-{job_id}.html").read_text()) == call_ids
    by_id = run_pid("view", job_id, "-o", str(tmp_path / "by-id.html"))   # `pid run` jobs are in the store too
    assert by_id.code == 0, by_id.stderr
    load = chromium.dump_dom(tmp_path / "by-id.html")
    assert load.console == []
    assert tool_calls_in(load.dom) == call_ids
    assert 'class="add">+print("hello, pid")</div>' in load.dom   # the edit's diff, and the patch's
    assert "completed" in load.dom and "Done: hello.py now greets pid." in load.dom
    assert '<details class="thinking">' in load.dom and "<script>x()" not in load.dom
    chromium.screenshot(tmp_path / "by-id.html", tmp_path / "real-job.png")
