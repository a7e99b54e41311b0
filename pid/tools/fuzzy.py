"""Text matching for edit: exact first, then on a normalised copy, always mapped back to the original's span.

pi once applied fuzzy edits to the normalised copy and wrote that back, rewriting every line of the file. Here the
normalised text carries, for each of its characters, the span of original characters it came from, so a match is
replaced in the original and every byte outside the matched span stays as it was.
"""
from __future__ import annotations

import bisect
import unicodedata
from array import array
from dataclasses import dataclass

# Applied after NFKC (which already turns NBSP, the U+2000 spaces and fullwidth forms into ASCII).
_FUZZY_TABLE = str.maketrans({
    **{c: "'" for c in "\u2018\u2019\u201a\u201b\u2032"},
    **{c: '"' for c in "\u201c\u201d\u201e\u201f\u2033"},
    **{c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63"},
    **{c: " " for c in "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                       "\u202f\u205f\u3000"},
})


def normalize_fuzzy(text: str) -> str:
    """The normalised form of `text` (LF line endings expected): what oldText is compared as."""
    return NormalizedText.build(text).text


@dataclass
class NormalizedText:
    """`text` plus, for each of its characters, the [start, end) span in the source it was produced from."""
    text: str
    starts: array
    ends: array

    @classmethod
    def build(cls, source: str) -> "NormalizedText":
        out: list[str] = []
        starts = array("i")
        ends = array("i")
        pos = 0
        for i, line in enumerate(source.split("\n")):
            if i:
                out.append("\n")
                starts.append(pos - 1)
                ends.append(pos)
            if line.isascii():
                kept = line.rstrip()
                out.append(kept)
                starts.extend(range(pos, pos + len(kept)))
                ends.extend(range(pos + 1, pos + len(kept) + 1))
            else:
                chars, line_starts, line_ends = _normalize_line(line, pos)
                out.append("".join(chars))
                starts.extend(line_starts)
                ends.extend(line_ends)
            pos += len(line) + 1
        return cls("".join(out), starts, ends)

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The source span behind normalised characters [start, end) (widened to whole source clusters)."""
        return self.starts[start], self.ends[end - 1]


def _normalize_line(line: str, pos: int) -> tuple[list[str], list[int], list[int]]:
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i = 0
    while i < len(line):
        j = i + 1
        while j < len(line) and unicodedata.combining(line[j]):
            j += 1  # a base character with its combining marks normalises as one cluster
        produced = unicodedata.normalize("NFKC", line[i:j]).translate(_FUZZY_TABLE)
        for ch in produced:
            chars.append(ch)
            starts.append(pos + i)
            ends.append(pos + j)
        i = j
    while chars and chars[-1].isspace():  # trailing whitespace of the line
        chars.pop()
        starts.pop()
        ends.pop()
    return chars, starts, ends


@dataclass
class Match:
    count: int                      # occurrences (non-overlapping) of the needle
    span: tuple[int, int] | None    # [start, end) in the searched text when count == 1
    fuzzy: bool


def find_unique(haystack: str, needle: str,
                normalized: NormalizedText | None = None) -> tuple[Match, NormalizedText | None]:
    """Exact match first; with none, match on normalised text and map the span back to `haystack`.

    Returns the match and the normalised haystack (built lazily, reusable for further needles).
    """
    count = haystack.count(needle)
    if count:
        at = haystack.find(needle)
        return Match(count, (at, at + len(needle)) if count == 1 else None, False), normalized
    normalized = normalized or NormalizedText.build(haystack)
    fuzzy_needle = normalize_fuzzy(needle)
    if not fuzzy_needle:
        return Match(0, None, True), normalized
    count = normalized.text.count(fuzzy_needle)
    if count != 1:
        return Match(count, None, True), normalized
    at = normalized.text.index(fuzzy_needle)
    return Match(1, normalized.source_span(at, at + len(fuzzy_needle)), True), normalized


class LineEndings:
    """Matching happens on LF text; this maps LF-text offsets back to the file's own text (CRLFs kept)."""

    def __init__(self, original: str) -> None:
        self.original = original
        self.lf = original.replace("\r\n", "\n")
        # LF-text positions of newlines that were CRLF in the original
        self._crlf: list[int] = []
        if len(self.lf) != len(original):
            shift = 0
            start = 0
            while (k := original.find("\r\n", start)) != -1:
                self._crlf.append(k - shift)
                shift += 1
                start = k + 2
        first_nl = original.find("\n")
        self.newline = "\r\n" if first_nl > 0 and original[first_nl - 1] == "\r" else "\n"

    def to_original(self, span: tuple[int, int]) -> tuple[int, int]:
        a, b = span
        return a + bisect.bisect_left(self._crlf, a), b + bisect.bisect_left(self._crlf, b)

    def restore(self, text: str) -> str:
        """`text` (any line endings) with the file's line ending."""
        text = text.replace("\r\n", "\n")
        return text.replace("\n", self.newline) if self.newline != "\n" else text
