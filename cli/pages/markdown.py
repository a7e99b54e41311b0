"""A small, strict Markdown subset as HTML, for the assistant's text on `pid view`'s page (cli/pages/job.py).

The text is the model's, hence hostile: nothing in it ever becomes markup of its own. Every piece of text goes
through blocks.esc; the only tags are the fixed ones this module writes (p, br, h3-h6, ul, ol, li, pre, code, em,
strong, a); the only attribute taken from the text is a link's href, and only for an absolute http(s) URL with a
host and no quote, space or angle bracket in it. Raw HTML in the text stays visible as text. Anything this subset
does not know (tables, images, nested lists, HTML blocks) shows as the text it is. Every pattern is bounded, so that
no input makes the regular expressions slow.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

from pid.cli.pages.blocks import BIDI, esc

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*([^`\n]*)")
_HEADING = re.compile(r" {0,3}(#{1,6})[ \t]+(.*)")   # the closing #s are cut in Python: see _heading_text
_BULLET = re.compile(r" {0,3}[-*+][ \t]+(.*)")
_NUMBERED = re.compile(r" {0,3}(\d{1,9})[.)][ \t]+(.*)")
_LANG = re.compile(r"[A-Za-z0-9_+.#-]{1,32}")

# Inline: a code span, a link, or a backslash-escaped punctuation character; the rest is plain text. A code span
# opens only at the start of a whole run of backticks, so a long run is not tried again from each of its backticks.
_INLINE = re.compile(r"(?<!`)(?P<ticks>`{1,8})(?!`)(?P<code>[^\n]{1,2000}?)(?<!`)(?P=ticks)(?!`)"
                     r"|\[(?P<label>[^\[\]\n]{1,500})\]\((?P<url>[^()\s]{1,2000})\)"
                     r"|\\(?P<escaped>[!-/:-@\[-`{-~])")
# Strong text holds no ** (or __) of its own: an opener that does not close is given up at the next one, not tried
# on up to 500 characters (a line of " **a" openers was quadratic).
_STRONG = re.compile(r"(?<![*\w])\*\*(?=[^\s*])((?:[^*\n]|\*(?!\*)){1,500}?)(?<=[^\s*])\*\*(?![*\w])"
                     r"|(?<![_\w])__(?=[^\s_])((?:[^_\n]|_(?!_)){1,500}?)(?<=[^\s_])__(?![_\w])")
_EM = re.compile(r"(?<![*\w])\*(?=[^\s*])([^\n*]{1,500}?)(?<=[^\s*])\*(?![*\w])"
                 r"|(?<![_\w])_(?=[^\s_])([^\n_]{1,500}?)(?<=[^\s_])_(?![_\w])")
_SAFE_URL = re.compile(r"https?://[^\s\"'<>`\\]+", re.IGNORECASE)


def safe_href(url: str) -> str | None:
    """The URL if it is an absolute http(s) URL with a host, else None (javascript:, data:, relative, odd)."""
    if not _SAFE_URL.fullmatch(url) or BIDI.search(url):   # (esc would show a bidi control: another URL)
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme.lower() in ("http", "https") and parts.hostname else None


def _heading_text(text: str) -> str:
    """A heading's text without its closing sequence (spaces or tabs, then #s, then spaces or tabs), done by hand:
    a lazy pattern for it backtracks quadratically over a long line of blanks."""
    text = text.rstrip(" \t")
    bare = text.rstrip("#")
    if bare != text and (not bare or bare[-1] in " \t"):
        text = bare.rstrip(" \t")
    return text


def _emphasis(escaped: str) -> str:
    """**strong** and *em* (or with underscores, not inside words) on text that is already HTML-escaped."""
    out: list[str] = []
    at = 0
    for m in _STRONG.finditer(escaped):
        out.append(_EM.sub(_em, escaped[at:m.start()]))
        out.append(f"<strong>{_EM.sub(_em, m.group(1) or m.group(2))}</strong>")
        at = m.end()
    out.append(_EM.sub(_em, escaped[at:]))
    return "".join(out)


def _em(m: re.Match[str]) -> str:
    return f"<em>{m.group(1) or m.group(2)}</em>"


def inline(text: str) -> str:
    """One block's text: code spans, http(s) links, emphasis, line breaks; everything else escaped."""
    out: list[str] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            out.append(_emphasis(esc("".join(plain))))
            plain.clear()
    at = 0
    for m in _INLINE.finditer(text):
        plain.append(text[at:m.start()])
        at = m.end()
        if m.group("escaped") is not None:
            flush()
            out.append(esc(m.group("escaped")))
        elif m.group("code") is not None:
            flush()
            code = m.group("code")
            if code.startswith(" ") and code.endswith(" ") and code.strip():
                code = code[1:-1]
            out.append(f"<code>{esc(code)}</code>")
        else:
            href = safe_href(m.group("url"))
            if href is None:   # not a link: the text as it was written
                plain.append(m.group(0))
                continue
            flush()
            out.append(f'<a href="{esc(href)}" rel="noopener noreferrer nofollow">'
                       f'{_emphasis(esc(m.group("label")))}</a>')
    plain.append(text[at:])
    flush()
    return "".join(out).replace("\n", "<br>")


def render(text: str) -> str:
    """The text as HTML blocks: paragraphs, headings (# to ###### as h3 to h6: the page has h1 and h2), fenced
    code, bulleted and numbered lists (one level; an indented line continues its item)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []
    kind = ""                 # "ul" or "ol" while a list is open
    start = 1

    def close_para() -> None:
        if para:
            out.append(f"<p>{inline(chr(10).join(para))}</p>")
            para.clear()

    def close_list() -> None:
        nonlocal kind
        if kind:
            first = f' start="{start}"' if kind == "ol" and start != 1 else ""
            out.append(f"<{kind}{first}>" + "".join(f"<li>{inline(i)}</li>" for i in items) + f"</{kind}>")
            items.clear()
            kind = ""

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.fullmatch(line)
        if fence:
            close_para()
            close_list()
            mark = fence.group(1)
            body: list[str] = []
            i += 1
            while i < len(lines) and not re.fullmatch(rf" {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*", lines[i]):
                body.append(lines[i])
                i += 1
            lang = fence.group(2).split()[0] if fence.group(2).split() else ""
            cls = f' class="language-{esc(lang)}"' if _LANG.fullmatch(lang) else ""
            out.append(f"<pre><code{cls}>{esc(chr(10).join(body))}</code></pre>")
            i += 1
            continue
        heading = _HEADING.fullmatch(line)
        bullet = _BULLET.fullmatch(line)
        numbered = _NUMBERED.fullmatch(line)
        if not line.strip():
            close_para()
            close_list()
        elif heading:
            close_para()
            close_list()
            level = min(len(heading.group(1)) + 2, 6)
            out.append(f"<h{level}>{inline(_heading_text(heading.group(2)))}</h{level}>")
        elif bullet or numbered:
            close_para()
            wanted = "ul" if bullet else "ol"
            if kind != wanted:
                close_list()
                kind = wanted
                start = int(numbered.group(1)) if numbered else 1
            items.append(bullet.group(1) if bullet else numbered.group(2) if numbered else "")
        elif kind and line[:1] in (" ", "\t"):   # an indented line continues the list's last item
            items[-1] += "\n" + line.strip()
        else:
            close_list()
            para.append(line)
        i += 1
    close_para()
    close_list()
    return "".join(out)
