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


PWN = "<script>document.body.setAttribute('data-pwned','yes')</script>"
FAMILY_SCRIPT = [
    {"text": "## Plan\nFirst **look**, then fix `hello.py`:\n- try an edit\n- run it\n\n"
             f"[the docs](https://example.com/docs) [evil](javascript:alert(1)) {PWN}",
     "tool_calls": [
         {"name": "edit", "arguments": {"path": "hello.py",
                                        "edits": [{"oldText": "print('no such line')", "newText": "x = 1"}]}},
         {"name": "bash", "arguments": {"command": "python3 hello.py && exit 3"}}]},
    {"tool_calls": [{"name": "edit", "arguments": {"path": "hello.py", "edits": [
        {"oldText": 'print("hello")', "newText": 'print("hello, pid")'}]}}]},
    {"text": "### Done\nThe greeting is *fixed*:\n\n```python\nprint(\"hello, pid\")\n```\n"
             "<img src=x onerror=\"document.body.setAttribute('data-pwned','yes')\">"},
    # the continuation
    {"tool_calls": [{"name": "bash", "arguments": {"command": "cat hello.py"}}]},
    {"text": "Still fine: **continued**."},
]


def screenshot_dir(tmp_path: Path) -> Path:
    """Where the screenshots go: $PID_TEST_ARTIFACTS/view-browser when set (CI keeps it), else the test's tmp_path;
    printed, so that a run's output says where to look."""
    import os
    root = os.environ.get("PID_TEST_ARTIFACTS")
    where = Path(root) / "view-browser" if root else tmp_path / "screenshots"
    where.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {where}")
    return where


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, path


@pytest.mark.docker
def test_a_real_continued_job_in_chromium_markdown_failed_edit_and_family(run_pid, worker, sample_repo, tmp_path):
    """Acceptance (issue 22): a real job, run against the scripted model, with a failed edit, Markdown (and a hostile
    script and javascript: link) in its text, continued by a second job; both pages in Chromium."""
    chromium.need_chromium()
    with ScriptedLLM(FAMILY_SCRIPT) as llm:
        ran = run_pid("run", "Make hello.py greet pid.", "--repo", str(sample_repo), "--json", "--model", "scripted",
                      "--base-url", llm.base_url, "--api-key", "sk-test", "--out", str(tmp_path / "out"))
        assert ran.code == 0, ran.stderr
        parent = ran.json()["id"]
        more = run_pid("continue", parent, "Check it once more.", "--wait", "--json", "--out", str(tmp_path / "o2"))
        assert more.code == 0, (more.stdout, more.stderr)
        child = more.json()["id"]
        assert more.json()["parent"] == parent
    res = run_pid("view", child, "-o", str(tmp_path / "child.html"))
    assert res.code == 0, res.stderr
    parent_page = tmp_path / f"pid-view-{parent}.html"
    assert parent_page.is_file()   # written beside the child's, which links to it

    load = chromium.dump_dom(parent_page)
    dom = load.dom
    assert load.console == []
    # Markdown, rendered: a heading, strong, inline code, a list, an http link, a highlighted code block.
    assert '<h4>Plan</h4>' in dom and '<strong>look</strong>' in dom and '<code>hello.py</code>' in dom
    assert '<ul><li>try an edit</li><li>run it</li></ul>' in dom
    assert '<a href="https://example.com/docs" rel="noopener noreferrer nofollow">the docs</a>' in dom
    assert '<h5>Done</h5>' in dom and '<em>fixed</em>' in dom and '<code class="language-python">' in dom
    # ...and the hostile parts as text: no script ran or was injected, no javascript: link, no image.
    assert PWNED_ATTR not in dom and "<script" not in dom and "<img" not in dom
    assert not re.search(r'href="\s*javascript:', dom, re.IGNORECASE)
    assert "[evil](javascript:alert(1))" in dom and "&lt;script&gt;document.body" in dom
    # The failed edit: marked not applied, its reason open; the failed command's output open; times on each call.
    failed_edit = dom[dom.index('data-tool="edit"'):]
    failed_edit = failed_edit[:failed_edit.index('data-tool-call=')]
    assert ">not applied</span>" in failed_edit and '<details class="output" open="">' in failed_edit
    assert "Could not find" in failed_edit
    assert dom.count('<details class="output" open="">') == 2
    assert dom.count("<time datetime=") == 3 and dom.count('class="took"') == 3   # edit, bash, edit
    # The family: the parent's page links its child's, and the child's its parent's.
    assert f'<a href="child.html" data-relation="continued by"><code>{child}</code></a>' in dom
    child_load = chromium.dump_dom(tmp_path / "child.html")
    assert child_load.console == []
    assert f'<a href="pid-view-{parent}.html" data-relation="continues"><code>{parent}</code></a>' in child_load.dom
    assert "<strong>continued</strong>" in child_load.dom

    shots = screenshot_dir(tmp_path)
    for page, name in ((parent_page, "parent.png"), (tmp_path / "child.html", "child.png")):
        shot = chromium.screenshot(page, shots / name)
        assert shot.console == []
        assert_png(shots / name)
