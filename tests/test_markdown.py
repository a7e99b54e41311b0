"""cli/pages/markdown.py, the strict Markdown subset of the assistant's text on `pid view`'s page: what it renders,
and that hostile text never becomes markup (no raw HTML, no script or data link, no attribute of its own)."""
from __future__ import annotations

import pytest

from pid.cli.pages.markdown import render, safe_href
from tests.test_html_view import Structure

ALLOWED = {"p", "br", "h3", "h4", "h5", "h6", "ul", "ol", "li", "pre", "code", "em", "strong", "a"}


def assert_safe(html_text: str) -> Structure:
    """Only the subset's tags; the only attributes a link's href (http/https) and rel, a code block's class."""
    s = Structure(html_text)
    for tag, attrs in s.starts:
        assert tag in ALLOWED, tag
        for name, value in attrs.items():
            if tag == "a" and name == "href":
                assert (value or "").startswith(("http://", "https://")), value
            elif tag == "a":
                assert name == "rel", name
            elif tag == "code" and name == "class":
                assert (value or "").startswith("language-"), value
            elif tag == "ol" and name == "start":
                assert (value or "").isdigit()
            else:
                raise AssertionError(f"{tag} {name}={value}")
    return s


def test_the_subset_renders():
    out = render("# Plan\n\nSome **bold**, *em*, __strong__ and _em_ text with `code <x>` in it,\nand a second line."
                 "\n\n- one\n- two *b*\n  goes on\n\n3. third\n4. fourth\n\n```python\nif a < b:\n    print('x')\n```"
                 "\n\nSee [the docs](https://example.com/a?b=1&c=2) and snake_case_names and 2*3*4.")
    assert out == (
        "<h3>Plan</h3>"
        "<p>Some <strong>bold</strong>, <em>em</em>, <strong>strong</strong> and <em>em</em> text with "
        "<code>code &lt;x&gt;</code> in it,<br>and a second line.</p>"
        "<ul><li>one</li><li>two <em>b</em><br>goes on</li></ul>"
        '<ol start="3"><li>third</li><li>fourth</li></ol>'
        '<pre><code class="language-python">if a &lt; b:\n    print(&#x27;x&#x27;)</code></pre>'
        '<p>See <a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer nofollow">the docs</a> and '
        "snake_case_names and 2*3*4.</p>")
    assert_safe(out)


def test_an_unclosed_fence_runs_to_the_end_and_escapes():
    out = render("text\n~~~~\n<script>x()</script>\n```\nstill code")
    assert out == "<p>text</p><pre><code>&lt;script&gt;x()&lt;/script&gt;\n```\nstill code</code></pre>"


@pytest.mark.parametrize("text", [
    "<script>document.body.setAttribute('data-pwned','yes')</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](javascript&#58;alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "[click](//evil.example/x)",
    "[click](/relative)",
    "[click](https://x.example/\"onmouseover=\"alert(1))",
    "[click](https://x.example/'onmouseover='alert(1))",
    "[click](https://x.example/a<b)",
    "[click](http:alert)",
    "[a](https://ok.example/)<script>x</script>",
    "# <b onclick=x>head</b>",
    "- <iframe src=https://x.example>",
    "```js\" onload=\"x\n<svg onload=x>\n```",
    "`<script>`x`</script>`",
    "**<a href=javascript:x>bold</a>**",
    "[**x**](https://a.example/) [`<i>`](https://b.example/)",
    "<https://autolink.example/>",
    "&lt;script&gt; &#x3C;script&#x3E;",
])
def test_hostile_text_stays_text(text):
    out = render(text)
    s = assert_safe(out)
    assert "javascript" not in "".join(v or "" for _, a in s.starts for v in a.values()).lower()
    assert "<script" not in out and "<img" not in out and "<iframe" not in out and "<svg" not in out
    # Whatever it says, the words are still there to read.
    assert "script" not in text or "script" in "".join(s.text)


def test_only_http_links_with_a_host_are_links():
    assert safe_href("https://example.com/x") == "https://example.com/x"
    assert safe_href("HTTP://example.com") == "HTTP://example.com"
    for bad in ("javascript:alert(1)", "data:text/html,x", "https://", "http:///x", "ftp://x.example/", "mailto:a@b",
                "https://a.example/\\x", "https://a.example/ x",
                "https://example.com/a\u202eb"):   # (the page shows a bidi control as a mark: another URL)
        assert safe_href(bad) is None, bad


def test_a_code_span_opens_only_at_a_whole_run_of_backticks():
    """Not from inside a longer run: so a run of backticks is tried once, not once per backtick (quadratic)."""
    assert render("````x`") == "<p>````x`</p>"
    assert render("a ``b`` `c`") == "<p>a <code>b</code> <code>c</code></p>"
    assert render("`````````x`````````") == "<p>`````````x`````````</p>"   # longer than a span's 8


def test_a_heading_loses_its_closing_sequence_only():
    assert render("# Title ##") == "<h3>Title</h3>"
    assert render("## x \t## \t") == "<h4>x</h4>"
    assert render("# #") == "<h3></h3>"
    assert render("# a#") == "<h3>a#</h3>"
    assert render("# a \\#") == "<h3>a #</h3>"


def test_strong_text_holds_no_strong_marker_of_its_own():
    """An opener gives up at the next ** (or __), so a line of openers that never close costs no more than its length
    (a 500-character try from each was quadratic); the inner pair is the strong one."""
    assert render("**a **b** c**") == "<p>**a <strong>b</strong> c**</p>"
    assert render("__a __b__ c__") == "<p>__a <strong>b</strong> c__</p>"
    assert render("**bold *em* text**") == "<p><strong>bold <em>em</em> text</strong></p>"


def test_pathological_input_renders():
    """Many openers that never close, long lines, deep brackets: bounded patterns, a page all the same. The last
    ones were quadratic (up to seconds per block, hundreds of blocks to a page) before the code span, heading
    and strong fixes."""
    for text in ("*a " * 20_000, "_a " * 20_000, "**a " * 20_000, "`" * 20_000 + "x", "[" * 20_000 + "](",
                 "[a](" + "h" * 50_000, "- x\n" * 5_000, "#" * 50_000,
                 "- " + "`" * 20_000, "# a" + "```" * 7_000, "# a" + " \t" * 10_000 + "#x", " **a" * 5_000):
        assert_safe(render(text))
