"""The HTML renderer of `pid view` (cli/pages/job.py, cli/pages/batch.py, cli/pages/blocks.py), without a browser:
escaping of hostile transcripts, every tool call present, diffs highlighted, missing fields tolerated, bounded
pages."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from pid.cli.pages.batch import render_batch
from pid.cli.pages.blocks import Limits, clip, diff_html
from pid.cli.pages.job import render_job
from tests.view_fixtures import (BATCH_ITEMS, HOSTILE, HOSTILE_CALL_IDS, PWNED_ATTR, SessionBuilder, call,
                                 hostile_result, hostile_session, simple_session, write_batch, write_job)


class Structure(HTMLParser):
    """What a page is made of: its tags, their attributes, its text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.ends: list[str] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.ends.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def count(self, tag: str) -> int:
        return sum(1 for t, _ in self.starts if t == tag)

    def attr_values(self, name: str) -> list[str]:
        return [a[name] or "" for _, a in self.starts if name in a]


def assert_inert(text: str, scripts: int = 0) -> Structure:
    """Nothing the transcript carried became markup: only our own tags, no handler attribute, balanced details."""
    s = Structure(text)
    assert s.count("script") == scripts
    assert s.count("img") == 0
    assert not [a for _, attrs in s.starts for a in attrs if a.startswith("on")]
    for tag in ("details", "pre", "div", "summary"):
        assert s.count(tag) == s.ends.count(tag), tag
    assert PWNED_ATTR not in text
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    return s


def job_page(tmp_path: Path, **kwargs) -> str:
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    return render_job(str(job), **kwargs)


def test_a_hostile_transcript_is_escaped_everywhere(tmp_path):
    text = job_page(tmp_path)
    s = assert_inert(text)
    visible = "".join(s.text)
    # The hostile strings are there, as text: in the task, the user message, thinking, text, a tool's arguments and
    # output, the edit's and write's diffs, the compaction summary, the check, the error, the final message.
    assert visible.count(HOSTILE) >= 10
    assert "</details>" in visible and "<script>" in visible


def test_bidi_controls_are_shown_where_they_stand(tmp_path):
    """A "Trojan Source" line reads otherwise than it runs: on the page each control is a visible mark, in the
    patch, the model's text and a tool's output alike (an attack review's: they came through unchanged)."""
    trojan = 'if access_level != "user\u202e \u2066// Check if admin\u2069 \u2066":'
    b = SessionBuilder()
    b.user("review this")
    b.assistant({"type": "text", "text": "Done: " + trojan}, call("c1", "bash", command="cat a.py"))
    b.result("c1", "bash", trojan)
    b.assistant({"type": "text", "text": "ok"}, stop="stop")
    result = {"id": "j", "status": "completed", "exit_reason": "stop", "task": "t"}
    job = write_job(tmp_path / "job", result, b.text(), patch=f"--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n+{trojan}\n")
    text = render_job(str(job))
    visible = "".join(Structure(text).text)
    assert not any(ch in text for ch in "\u202e\u2066\u2069")
    assert visible.count("\u27e8U+202E\u27e9") >= 3, visible
    assert 'user\u27e8U+202E\u27e9 \u27e8U+2066\u27e9// Check if admin\u27e8U+2069\u27e9' in visible


def test_every_tool_call_is_on_the_page_with_its_output(tmp_path):
    s = Structure(job_page(tmp_path))
    assert s.attr_values("data-tool-call") == HOSTILE_CALL_IDS
    visible = "".join(s.text)
    assert "hello.py\nREADME.md" in visible          # a bash output, in its collapsible block
    assert "No matches" in visible and "Command exited with code 3" in visible
    outputs = [attrs for tag, attrs in s.starts if tag == "details" and attrs.get("class") == "output"]
    assert len(outputs) == len(HOSTILE_CALL_IDS)
    errors = [attrs for tag, attrs in s.starts if tag == "div" and "error" in (attrs.get("class") or "").split()]
    assert len(errors) == 2


def test_the_header_shows_the_result_and_its_check(tmp_path):
    text = job_page(tmp_path)
    visible = "".join(Structure(text).text)
    for expected in ("failed", "check_failed", "scripted", "600", "$0.0050", "7.2s", "CHECK-TAIL-MARK", "exit 1",
                     "python3 -m unittest"):
        assert expected in visible, expected
    assert '<details class="check-output" open>' in text   # a failed check shows its output


def test_edits_writes_and_the_patch_are_highlighted_diffs(tmp_path):
    text = job_page(tmp_path)
    # The edit with the tool's own patch, the legacy edit from its arguments, the write's whole content.
    assert '<div class="del">-print(&quot;hello&quot;)</div><div class="add">+print(&quot;hello, pid&quot;)</div>' \
        in text
    assert '<div class="add">+b = 3  # &lt;/details&gt;' in text and '<div class="del">-b = 2</div>' in text
    assert '<div class="add">+made by the agent</div>' in text
    patch = text[text.index('id="patch"'):]
    assert '<div class="meta">diff --git a/hello.py b/hello.py</div>' in patch
    assert '<div class="hunk">@@ -1 +1 @@</div>' in patch
    assert '<div class="add">+print(&quot;hello, pid&quot;)  # &lt;/details&gt;&lt;script&gt;' in patch


def test_a_write_over_a_file_is_never_shown_as_a_new_file(tmp_path):
    """A new user's: every write showed as `@@ -0,0 +1,N @@`, a file made from nothing, though it may replace one.
    A write of a path this session wrote before is a diff against that; any other says it is the whole content."""
    s = SessionBuilder()
    s.user("t")
    s.assistant(call("w1", "write", path="notes.txt", content="one\ntwo\n"))
    s.result("w1", "write", "Successfully wrote 8 bytes to notes.txt")
    s.assistant(call("w2", "write", path="notes.txt", content="one\nthree\n"))
    s.result("w2", "write", "Successfully wrote 10 bytes to notes.txt")
    s.assistant(call("e1", "edit", path="notes.txt", oldText="three", newText="four"))
    s.result("e1", "edit", "Successfully replaced 1 block(s) in notes.txt")
    s.assistant(call("w3", "write", path="notes.txt", content="five\n"))
    s.result("w3", "write", "Successfully wrote 5 bytes to notes.txt")
    text = render_job(str(write_job(tmp_path / "job", None, s.text(), patch=None)))
    assert "@@ -0,0" not in text
    assert text.count("written whole: 2 lines (what it replaced, if anything, is not in the transcript)") == 1
    assert '<div class="del">-two</div><div class="add">+three</div>' in text   # the second write, against the first
    assert "written whole: 1 line (" in text   # after an edit, what was there is not known whole


def test_the_collected_files_and_what_was_left_out_are_on_the_page(tmp_path):
    """A new user's: only `pid result` said which --file was missing or which patch section was dropped."""
    result = {"id": "j", "status": "completed", "exit_reason": "stop",
              "artifacts": {"patch": "patch.diff", "files": ["files/workspace/notes.txt"],
                            "refused": [{"path": "/nope", "reason": "not found", "artifact": "files"},
                                        {"path": "<b>x</b>", "reason": "symlink", "artifact": "patch"}]}}
    text = render_job(str(write_job(tmp_path / "job", result, simple_session(["c1"]), patch=None)))
    assert_inert(text)
    assert "collected: <code>files/workspace/notes.txt</code>" in text
    assert "<li><code>/nope</code> <span class=\"dim\">(files)</span>: not found</li>" in text
    assert "<code>&lt;b&gt;x&lt;/b&gt;</code> <span class=\"dim\">(patch)</span>: symlink" in text


def test_thinking_compaction_branches_and_torn_lines(tmp_path):
    text = job_page(tmp_path)
    assert '<details class="thinking"><summary>thinking</summary>' in text
    assert "compaction · the history before this point was summarised (12,345 tokens before)" in text
    assert '<div class="dim">read: README.md</div>' in text and "modified: hello.py&lt;/details&gt;" in text
    assert "BRANCH-NOT-SHOWN" not in text
    assert "entries on other branches of the session are not shown" in text
    assert "1 line(s) of session.jsonl are not JSON" in text
    assert "thinking level: high" in text


def test_missing_fields_and_files_are_tolerated(tmp_path):
    # Only a session (no result.json, no patch): the header comes from the session.
    bare = write_job(tmp_path / "bare", None, simple_session(["c1", "c2"]), patch=None)
    text = render_job(str(bare))
    visible = "".join(Structure(text).text)
    assert "no patch.diff" in visible and "scripted" in visible and "360" in visible   # 3 × 120 tokens
    assert Structure(text).attr_values("data-tool-call") == ["c1", "c2"]
    # A result with nothing but odd values, a session of odd entries, an empty patch.
    odd = SessionBuilder()
    odd.add({"type": "message", "message": {"role": "assistant", "content": "not a list"}})
    odd.add({"type": "message", "message": {"role": "assistant", "content": [call("c9", "bash"), "junk", None]}})
    odd.add({"type": "message", "message": {"role": "toolResult"}})
    odd.add({"type": "message", "message": "nope"})
    odd.add({"type": "mystery"})
    odd.add({"type": "message", "message": {"role": "user", "content": [{"type": "image", "data": "AAAA"}]}})
    weird = write_job(tmp_path / "weird", {"status": None, "usage": "x", "check": "yes", "duration_s": "soon",
                                           "turns": [], "model": 3}, odd.text() + "[1, 2]\n", patch="")
    text = render_job(str(weird))
    assert_inert(text)
    assert "the patch is empty" in text and "c9" in text and "image" in text
    # Nothing at all but a result.json that is not an object.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "result.json").write_text("[]")
    assert "no transcript" in render_job(str(empty))


def test_a_job_store_record_fills_in_for_a_missing_result(tmp_path):
    job = write_job(tmp_path / "job", None, simple_session(["c1"]), patch=None)
    text = render_job(str(job), fallback={"id": "job-123", "status": "running", "model": "m-from-store"})
    visible = "".join(Structure(text).text)
    assert "job-123" in visible and "running" in visible and "m-from-store" in visible


def test_huge_outputs_are_clipped_with_a_note(tmp_path):
    s = SessionBuilder()
    s.user("go")
    s.assistant(call("c1", "bash", command="cat big"))
    s.result("c1", "bash", "HEAD-MARK\n" + "x" * 300_000 + "\nTAIL-MARK\n")
    s.assistant(call("c2", "write", path="big.txt", content="line\n" * 50_000))
    s.result("c2", "write", "ok")
    job = write_job(tmp_path / "job", None, s.text(), patch="+" * 10 + "\n")
    text = render_job(str(job))
    assert len(text) < 200_000
    assert "HEAD-MARK" in text and "TAIL-MARK" in text and "characters not shown here" in text
    assert "lines not shown here" in text


def test_a_50_mb_session_makes_a_bounded_page(tmp_path):
    s = SessionBuilder()
    s.user("go")
    ids = []
    for n in range(2_000):   # 2,000 tool calls with 25 kB of output each: about 50 MB
        ids.append(f"c{n}")
        s.assistant({"type": "text", "text": f"step {n}"}, call(f"c{n}", "bash", command=f"make step{n}"))
        s.result(f"c{n}", "bash", f"out {n}\n" + "y" * 25_000)
    path = tmp_path / "job" / "session.jsonl"
    write_job(tmp_path / "job", None, s.text(), patch=None)
    assert path.stat().st_size > 50_000_000
    text = render_job(str(tmp_path / "job"))
    assert len(text) < 8_000_000, len(text)
    calls = Structure(text).attr_values("data-tool-call")
    assert calls[:5] == ids[:5] and len(calls) > 150
    assert "listed one line each" in text and "The whole transcript is in session.jsonl" in text
    # Small limits: the later calls are one line each, then left out, and the page says how many.
    small = render_job(str(tmp_path / "job"), limits=Limits(full_budget=100_000, compact_budget=150_000))
    assert len(small) < 250_000
    assert "tool call(s) and" in small and "are not shown" in small


def test_clip_keeps_head_and_tail_and_says_what_is_left_out():
    shown, left = clip("a" * 10 + "b" * 10, 9)
    assert shown == "a" * 6 + "\n[… 11 characters not shown here …]\n" + "b" * 3 and left == 11
    assert clip("short", 10) == ("short", 0)


def test_diff_lines_are_classified():
    diff = ("diff --git a/x.sql b/x.sql\n--- a/x.sql\n+++ b/x.sql\n@@ -1,3 +1,2 @@\n -- a comment kept\n"
            "--- a comment removed\n+++ a counter added\n-x\n\\ No newline at end of file\n"
            "--- a/y\n+++ b/y\n@@ -5 +5,0 @@\n-gone\n")
    classes = [a["class"] for t, a in Structure(diff_html(diff, 100)).starts if t == "div"][1:]
    assert classes == ["meta", "meta", "meta", "hunk", "ctx", "del", "add", "del", "meta", "meta", "meta", "hunk",
                       "del"]
    # pi's numbered diff (details.diff): no hunk headers, the first character decides.
    assert [a["class"] for t, a in Structure(diff_html("-1 old\n+1 new\n 2 same", 100)).starts
            if t == "div"][1:] == ["del", "add", "ctx"]


def test_a_batch_index_links_each_item_and_is_sortable(tmp_path):
    batch = write_batch(tmp_path / "batch")
    index, pages = render_batch(str(batch), str(batch / "view"))
    text = Path(index).read_text()
    s = assert_inert(text, scripts=1)
    rows = [a["data-id"] for t, a in s.starts if t == "tr" and "data-id" in a]
    assert rows == [i[0] for i in BATCH_ITEMS] + ["never-ran"]   # a resumed id's last line wins, in its place
    assert "running" not in "".join(s.text)
    links = s.attr_values("href")
    assert sorted(links) == sorted(Path(p).name for p in pages) and len(pages) == len(BATCH_ITEMS)
    assert "proj-a-1.html" in links and all(name.endswith(".html") and "/" not in name for name in links)
    assert [a.get("data-key") for t, a in s.starts if t == "th"] == \
        ["id", "status", "check", "cost", "tokens", "turns", "duration_s", "task"]
    visible = "".join(s.text)
    assert "1 line(s) of batch.jsonl are not JSON" in visible and "checks passed 2/3" in visible
    assert "summary.json" in visible and "cost.p50" in visible
    # Each item's page is its job page, linking back.
    page = Path(batch / "view" / "proj-b-2.html").read_text()
    assert_inert(page)
    assert Structure(page).attr_values("data-tool-call") == ["call_1_a", "call_1_b"]
    assert 'href="index.html"' in page
    # Cells carry their sort values.
    assert 'data-v="0.034"' in text and 'data-v="40.0"' in text


def test_a_batch_page_named_with_o_keeps_its_items_pages_in_a_folder_of_their_own(tmp_path):
    """`pid view DIR -o report.html` wrote the items' pages beside report.html, over files of the same names."""
    from pid.cli.view import view
    from click.testing import CliRunner
    batch = write_batch(tmp_path / "batch")
    mine = tmp_path / "out" / "proj-a-1.html"
    mine.parent.mkdir()
    mine.write_text("MINE")
    result = CliRunner().invoke(view, [str(batch), "-o", str(tmp_path / "out" / "report.html")])
    assert result.exit_code == 0, result.output
    assert mine.read_text() == "MINE"
    links = Structure((tmp_path / "out" / "report.html").read_text()).attr_values("href")
    assert "report-items/proj-a-1.html" in links and all(name.startswith("report-items/") for name in links)
    item = (tmp_path / "out" / "report-items" / "proj-a-1.html").read_text()
    assert "../report.html" in Structure(item).attr_values("href")
    assert CliRunner().invoke(view, [str(batch), "-o", str(tmp_path / "out" / "r#1.html")]).exit_code == 0
    assert "r%231-items/proj-a-1.html" in Structure((tmp_path / "out" / "r#1.html").read_text()).attr_values("href")
    item = (tmp_path / "out" / "r#1-items" / "proj-a-1.html").read_text()
    assert "../r%231.html" in Structure(item).attr_values("href")


def test_a_batch_item_id_never_leaves_the_view_directory(tmp_path):
    batch = tmp_path / "batch"
    batch.mkdir()
    (tmp_path / "outside").mkdir()
    write_job(tmp_path / "outside", {"id": "x", "task": "OUTSIDE"}, simple_session(["c"]))
    (batch / "batch.jsonl").write_text(json.dumps({"id": "../outside", "status": "completed"}) + "\n" +
                                       json.dumps({"id": "index", "status": "completed"}) + "\n")
    write_job(batch / "index", {"id": "j"}, simple_session(["c"]))
    index, pages = render_batch(str(batch), str(batch / "view"))
    assert [Path(p).name for p in pages] == ["index-2.html"]   # "index" is the index's own name
    assert "OUTSIDE" not in Path(index).read_text()
    assert sorted(p.name for p in (batch / "view").iterdir()) == ["index-2.html", "index.html"]


def test_an_empty_batch_renders(tmp_path):
    (tmp_path / "batch.jsonl").write_text("")
    index, pages = render_batch(str(tmp_path), str(tmp_path / "view"))
    assert pages == [] and "lists no items yet" in Path(index).read_text()


def test_hostile_text_in_batch_fields_is_escaped(tmp_path):
    (tmp_path / "batch.jsonl").write_text(json.dumps({"id": HOSTILE, "status": HOSTILE, "exit_reason": HOSTILE,
                                                      "cost": HOSTILE, "check": {"passed": HOSTILE}}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({HOSTILE: {HOSTILE: HOSTILE}}))
    index, _ = render_batch(str(tmp_path), str(tmp_path / "view"))
    assert_inert(Path(index).read_text(), scripts=1)


def test_one_tool_call_is_one_tool_call(tmp_path):
    one = render_job(str(write_job(tmp_path / "one", {"id": "j1", "status": "completed", "turns": 2,
                                                      "tool_calls": 1}, simple_session(["c1"]))))
    text = " ".join(Structure(one).text)
    assert "1 tool call" in text and "1 tool calls" not in text
    two = render_job(str(write_job(tmp_path / "two", {"id": "j2", "status": "completed", "turns": 3,
                                                      "tool_calls": 2}, simple_session(["c1", "c2"]))))
    assert "2 tool calls" in " ".join(Structure(two).text)


def test_assistant_text_is_markdown_and_user_text_is_not(tmp_path):
    s = SessionBuilder()
    s.user("**not bold** in a user message")
    s.assistant({"type": "text", "text": "## Plan\n- **fix** `calc.py`\n- [docs](https://example.com/d) "
                                         "[x](javascript:alert(1)) <script>x()</script>"}, stop="stop")
    job = write_job(tmp_path / "job", {"id": "j", "status": "completed", "final_message": "*Done* now"}, s.text())
    text = render_job(str(job))
    assert_inert(text)
    assert '<div class="md"><h4>Plan</h4><ul><li><strong>fix</strong> <code>calc.py</code></li>' in text
    assert '<a href="https://example.com/d" rel="noopener noreferrer nofollow">docs</a>' in text
    assert "[x](javascript:alert(1)) &lt;script&gt;x()&lt;/script&gt;" in text
    assert "<em>Done</em> now" in text                       # the final message is the assistant's too
    assert '<div class="text">**not bold** in a user message</div>' in text


def test_a_failed_edit_is_not_applied_and_errors_are_open_with_time_and_duration(tmp_path):
    s = SessionBuilder()
    s.user("go")
    s.assistant(call("c_edit", "edit", path="calc.py", edits=[{"oldText": "nope", "newText": "yes"}]),
                call("c_ok", "bash", command="true"), call("c_bad", "bash", command="false"))
    s.lines[-1]["timestamp"] = "2026-11-30T10:00:01.000Z"
    s.result("c_edit", "edit", "Could not find the exact text in calc.py.", is_error=True)
    s.lines[-1]["timestamp"] = "2026-11-30T10:00:01.250Z"
    s.result("c_ok", "bash", "")
    s.lines[-1]["timestamp"] = "2026-11-30T10:00:03.500Z"
    s.result("c_bad", "bash", "Command exited with code 1", is_error=True)
    s.lines[-1]["timestamp"] = "2026-11-30T10:02:01.000Z"
    job = write_job(tmp_path / "job", None, s.text(), patch=None)
    text = render_job(str(job))
    st = assert_inert(text)
    tools = text.split('data-tool-call="')[1:]
    edit, ok, bad = tools
    assert '<span class="badge bad not-applied">not applied</span>' in edit and "badge bad\">error" not in edit
    assert '<div class="not-applied-change"' in edit and '<div class="add">+yes</div>' in edit
    assert '<details class="output" open><summary>error · 1 line</summary>' in edit
    assert "Could not find the exact text in calc.py." in edit
    assert '<details class="output"><summary>output' in ok and "not applied" not in ok
    assert '<span class="badge bad">error</span>' in bad and '<details class="output" open>' in bad
    assert '<time datetime="2026-11-30T10:00:01.000Z"' in edit and ">10:00:01</time>" in edit
    assert '<span class="took">250 ms</span>' in edit
    assert '<span class="took">2.5s</span>' in ok and '<span class="took">2m00s</span>' in bad
    assert [a["datetime"] for t, a in st.starts if t == "time"] == ["2026-11-30T10:00:01.000Z"] * 3


def test_relatives_are_linked_and_a_watched_page_reloads(tmp_path):
    from pid.cli.pages.job import Relative
    job = write_job(tmp_path / "job", {"id": "child", "status": "completed", "parent": "mom"},
                    simple_session(["c1"]))
    plain = render_job(str(job))   # from result.json alone: named, with the command that makes its page
    assert '<code data-relation="continues">mom</code> <span class="dim">(pid view mom)</span>' in plain
    assert 'http-equiv="refresh"' not in plain and "live:" not in plain
    linked = render_job(str(job), relatives=[Relative("continues", "mom", "pid-view-mom.html"),
                                             Relative("continued by", "kid-1", "kid&1.html"),
                                             Relative("continued by", "kid-2", None)], refresh_s=2)
    assert_inert(linked)
    assert '<dt>continues</dt><dd><a href="pid-view-mom.html" data-relation="continues"><code>mom</code></a></dd>' \
        in linked
    assert ('<dt>continued by</dt><dd><a href="kid&amp;1.html" data-relation="continued by"><code>kid-1</code></a>, '
            '<code data-relation="continued by">kid-2</code>') in linked
    assert '<meta http-equiv="refresh" content="2">' in linked and "live: this page reloads every 2 s" in linked


def test_a_batch_item_whose_check_never_ran_says_so_on_its_row():
    """The summary counted it among the checks (not passed) while its row showed no check at all (the review's)."""
    from pid.cli.pages.batch import Item, row_html
    row = row_html(Item({"id": "slow", "status": "limit", "exit_reason": "wall_clock", "check_asked": True}))
    assert "not run" in row
    assert "not run" not in row_html(Item({"id": "plain", "status": "completed", "exit_reason": "stop"}))
