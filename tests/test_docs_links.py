"""Every relative link in README.md and docs/*.md names a file that exists, so moving a section never strands one."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(text: str) -> list[str]:
    """The targets of the page's Markdown links outside code (fenced blocks and `inline` spans)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def test_every_relative_link_points_to_a_file():
    broken = []
    for page in _pages():
        for target in _relative_links(page.read_text()):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_checker_sees_links():
    assert _relative_links("a [b](docs/x.md#y) `[c](no.md)` [d](https://e) [f](#g)\n```\n[h](i.md)\n```\n") == [
        "docs/x.md#y"]
    assert len(_pages()) > 1 and any(_relative_links(p.read_text()) for p in _pages())
