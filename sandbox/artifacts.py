"""Artifacts out of the sandbox: tar streams from an untrusted container turned into files on the host.

The agent controls every byte of these archives: member names, types, sizes and, for the patch, the text itself.
So every name is checked before anything is made, only regular files and directories are created (with fixed
modes), each path component is opened relative to the destination with O_NOFOLLOW, sizes and counts are capped,
and streams are processed in 64 KiB blocks, so memory stays small whatever an archive holds.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
import sys
import tarfile
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator

from pid.sandbox_lifecycle import FilesBudget, PatchCopy, Skipped   # the seam's data, made here
from pid.terminal import escaped

__all__ = ["Skipped", "PatchCopy", "FilesCopy", "FilesBudget", "ArtifactTooLarge", "unsafe_path_reason",
           "copy_patch", "extract_files"]

_BLOCK = 64 << 10                 # read and write granularity (small: each read is copied a few times)
_HEAD_MAX = 8 << 10               # patch lines other than hunk content longer than this drop their section
_MAX_NAME_BYTES = 4096
_MAX_SKIPPED = 100                # Skipped entries kept per call; the rest are only counted
_MAX_EXTENDED_HEADER = 16 << 10   # a pax or GNU long-name block: room for a 4096-byte name and link target
_MAX_EXTENDED_CHAIN = 4           # extended headers in a row before one member (tarfile recurses per header)
_MAX_NAME_PAIRS = 16              # readings of an unquoted `diff --git a/X b/Y` line worth checking

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\udc80-\udc9f]")  # C0, DEL, C1 (also as undecodable bytes 0x80-0x9f)
# Code points HFS+ ignores in names; git strips them too when it refuses `.git` (verify_path).
_IGNORABLE = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")


@dataclass
class FilesCopy:
    written: list[str]          # host paths of regular files and directories created, in order
    skipped: list[Skipped]
    total_bytes: int


class ArtifactTooLarge(Exception):
    """The artifact is over its size limit; nothing of it was kept."""


def unsafe_path_reason(name: str) -> str | None:
    """None if `name` (a relative, '/'-separated path from a tar member or a diff header) is safe to create on
    the host; else why not. `.git` is refused also as `.GIT`, with HFS+-ignored code points, NTFS trailing dots
    or spaces, or the 8.3 name `git~1`, because some host filesystems treat those as the same directory."""
    if not name:
        return "empty path"
    if _CONTROL.search(name):
        return "control character in name"
    try:
        size = len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return "invalid character in name"
    if size > _MAX_NAME_BYTES:
        return f"name longer than {_MAX_NAME_BYTES} bytes"
    if name.startswith("/"):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "path has '..'"
    if any(_is_dot_git(part) for part in parts):
        return "path inside .git"
    if all(part in ("", ".") for part in parts):
        return "empty path"
    return None


def _is_dot_git(part: str) -> bool:
    folded = _IGNORABLE.sub("", part).rstrip(". ").lower()
    return folded in (".git", "git~1")


class _Skips:
    """At most _MAX_SKIPPED entries, then only a count: a 100k-entry archive must not make a 100k-entry list."""

    def __init__(self, entries: list[Skipped]) -> None:
        self.entries = entries
        self.more = 0

    def add(self, name: str, reason: str) -> None:
        if len(self.entries) < _MAX_SKIPPED:
            self.entries.append(Skipped(escaped(name), reason))
        else:
            self.more += 1

    def close(self, unread: bool = False) -> None:
        notes = [f"and {self.more} more skipped"] if self.more else []
        if unread:
            notes.append("rest of the archive not read")
        if notes:
            self.entries.append(Skipped("…", "; ".join(notes)))


def new_file_over(max_bytes: int) -> str:
    """Why a new file is not in the patch: its diff alone is over --max-patch (the host's filter, or pid's git)."""
    return f"a new file whose diff alone is over the {_size_text(max_bytes)} limit (--max-patch): left out, the rest " \
           "of the patch kept"


def _size_text(limit: int) -> str:
    return f"{limit >> 20} MB" if limit and limit % (1 << 20) == 0 else f"{limit}-byte"


# -- reading tar streams ---------------------------------------------------------------------------------------------

class _BadArchive(tarfile.TarError):
    """The archive uses something refused here: sparse members, oversized or endless extended headers."""


_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
# tarfile before these releases searches a pax block with a backtracking regex (CVE-2024-6232): a long run of
# digits costs quadratic time, so such blocks are refused up front.
_PAX_SEARCH_BACKTRACKS = sys.version_info < (3, 11, 10) or (3, 12) <= sys.version_info < (3, 12, 6)
_LONG_DIGITS = re.compile(rb"[0-9]{512}")


class _GuardedTarInfo(tarfile.TarInfo):
    """tarfile reads extended headers and sparse maps whole, recursing once per header; refuse the forms that
    would let an archive make it hold or scan unbounded data."""

    def _proc_member(self, tar):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _BadArchive("sparse members are not supported")
        if self.type not in _EXTENDED_TYPES:
            member = super()._proc_member(tar)
            if member.size < 0:
                raise _BadArchive("negative member size")
            return member
        if not 0 <= self.size <= _MAX_EXTENDED_HEADER:
            raise _BadArchive(f"extended header over {_MAX_EXTENDED_HEADER} bytes")
        depth = getattr(tar, "_pid_extended_depth", 0)
        if depth >= _MAX_EXTENDED_CHAIN:
            raise _BadArchive("too many extended headers in a row")
        if _PAX_SEARCH_BACKTRACKS and self.type in _PAX_TYPES:
            self._screen_pax(tar)
        tar._pid_extended_depth = depth + 1
        try:
            member = super()._proc_member(tar)
        finally:
            tar._pid_extended_depth = depth
        if member.size < 0:
            raise _BadArchive("negative member size")
        return member

    def _screen_pax(self, tar) -> None:
        stream = tar.fileobj
        if getattr(stream, "comptype", None) != "tar" or not isinstance(getattr(stream, "buf", None), bytes):
            return
        data = stream.read(self._block(self.size))  # type: ignore[attr-defined]  # TarInfo's private block size
        stream.buf = data + stream.buf           # put it back for tarfile to read
        stream.pos -= len(data)
        if _LONG_DIGITS.search(data):
            raise _BadArchive("pax header with a run of 512 digits")

    def _proc_gnusparse_00(self, *args):
        raise _BadArchive("sparse members are not supported")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (docker's get_archive stream, a blob from the job store); a
    chunk is consumed through a memoryview, so small reads never copy its rest. Closing it closes the iterator."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            try:
                self._pending = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        super().close()


def _open_tar(chunks: Iterable[bytes]) -> tarfile.TarFile:
    """An uncompressed, forward-only reading of the chunk stream (no compression is guessed: no zip bombs)."""
    return tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), _BLOCK), mode="r|", tarinfo=_GuardedTarInfo)


def _regular(tar: tarfile.TarFile, member: tarfile.TarInfo) -> BinaryIO:
    """A regular member's data (extractfile gives None only for other kinds, which callers never pass)."""
    stream = tar.extractfile(member)
    assert stream is not None, member.name
    return stream  # type: ignore[return-value]


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Members one at a time; tarfile would otherwise keep every TarInfo it has read."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # type: ignore[attr-defined]  # tarfile's private list of what it has read
        yield member


def _data_size(member: tarfile.TarInfo) -> int:
    """Bytes of data that follow the member's header in the stream."""
    return member.size if member.isreg() or member.type not in tarfile.SUPPORTED_TYPES else 0


# -- the patch -------------------------------------------------------------------------------------------------------

def copy_patch(chunks: Iterable[bytes], dest: str, max_bytes: int) -> PatchCopy:
    """The tar stream holds one regular file, a `git diff --binary` patch: write it to `dest` without the file
    sections that name an unsafe path (diff --git, ---/+++, rename/copy lines), that make a symlink, or that are
    not in git's own format, which could hide a header `git apply` would still find, nor those of new files whose
    diff alone is over max_bytes. Raises ArtifactTooLarge when the rest is still over it (no file is left),
    FileNotFoundError without a regular file, tarfile.TarError for an unreadable or cut archive (the partial dest is
    removed)."""
    with _open_tar(chunks) as tar:
        for member in _members(tar):
            if member.isreg():
                return write_patch(_regular(tar, member), dest, max_bytes)
    raise FileNotFoundError("no regular file in the archive")


def write_patch(source: BinaryIO, dest: str, max_bytes: int) -> PatchCopy:
    """copy_patch's work on the patch file itself (read from pid's disk on the host: workspaces.read_patch)."""
    dropped: list[Skipped] = []
    skips = _Skips(dropped)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb", buffering=_BLOCK) as out:
            patch = _PatchFilter(out, max_bytes, skips)
            while block := source.read(_BLOCK):
                patch.feed(block)
            patch.finish()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest)
        raise
    skips.close()
    return PatchCopy(patch.size, dropped)


# pid's git diffs with --no-renames: a rename or copy is forged, and it would carry a link as it is (no mode line).
RENAMED = "a rename or copy, which pid's git never writes (it could carry a link)"
NEW_REPOSITORY = ("a git repository of its own (git init, cargo new): git records only its commit, not its files "
                  "(without its .git they are in the patch)")
_HUNK_HEADER = re.compile(rb"@@ -[0-9]+(?:,([0-9]+))? \+[0-9]+(?:,([0-9]+))? @@")
_MODE_LINE = re.compile(rb"(old mode|new mode|deleted file mode|new file mode) ([0-7]{6})")
_INDEX_LINE = re.compile(rb"index [0-9a-f]{4,64}\.\.[0-9a-f]{4,64}(?: ([0-7]{6}))?")
_SIMILARITY_LINE = re.compile(rb"(?:dis)?similarity index [0-9]{1,3}%")
_BINARY_HUNK = re.compile(rb"(?:literal|delta) [0-9]+\n")
_BASE85_LINE = re.compile(rb"[A-Za-z][0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]+\n")
_BARE_NAME_LINES = (b"rename from ", b"rename to ", b"rename old ", b"rename new ", b"copy from ", b"copy to ")
_QUOTED = re.compile(rb'"((?:[^"\\]|\\(?:[abtnvfr"\\]|[0-3][0-7]{2}))*)"')
_QUOTE_ESCAPE = re.compile(rb'\\(?:([abtnvfr"\\])|([0-3][0-7]{2}))')
_C_ESCAPES = {b"a": b"\a", b"b": b"\b", b"t": b"\t", b"n": b"\n", b"v": b"\v", b"f": b"\f", b"r": b"\r",
              b'"': b'"', b"\\": b"\\"}
_SECOND_NAME = re.compile(rb' (?="?b/)')
_SECTION_ENDS = ("header", "after_hunk", "binary_gap", "end")  # states a file section may stop in


def _unquote(raw: bytes) -> tuple[bytes, bytes] | None:
    """(name, text after it) for a C-quoted name at the start of `raw`, as git writes unusual names."""
    match = _QUOTED.match(raw)
    if match is None:
        return None
    name = _QUOTE_ESCAPE.sub(lambda m: _C_ESCAPES[m[1]] if m[1] else bytes([int(m[2], 8)]), match[1])
    return name, raw[match.end():]


def _one_name(raw: bytes) -> bytes | None:
    """The name that is all of `raw`, quoted or not; None if quoting is broken or text follows it."""
    if not raw.startswith(b'"'):
        return raw
    parsed = _unquote(raw)
    return parsed[0] if parsed is not None and not parsed[1] else None


def _diff_git_names(rest: bytes) -> list[tuple[bytes, bytes]] | None:
    """Every (a/X, b/Y) reading of a `diff --git` line's names; git splits an unquoted pair by guessing, so
    all readings are checked. None if there is none, or too many to be a real line."""
    pairs = []
    if rest.startswith(b'"'):
        parsed = _unquote(rest)
        if parsed is not None and parsed[1].startswith(b" "):
            second = _one_name(parsed[1][1:])
            if second is not None:
                pairs.append((parsed[0], second))
    else:
        splits = [m.start() for m in _SECOND_NAME.finditer(rest)]
        if len(splits) > _MAX_NAME_PAIRS:
            return None
        for at in splits:
            second = _one_name(rest[at + 1:])
            if second is not None:
                pairs.append((rest[:at], second))
    pairs = [(a, b) for a, b in pairs if a.startswith(b"a/") and b.startswith(b"b/")]
    return pairs or None


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class _PatchFilter:
    """Copies a patch to `out` a line at a time, keeping only well-formed file sections with safe names.

    Only the first _HEAD_MAX bytes of a line are ever held; the rest of a long line is passed on (or discarded)
    as it comes. A section is written as it is read and cut off again (truncate) if it turns out to be bad.
    Hunk bodies are counted like `git apply` counts them, so that a line such as `--- a/x` is checked exactly
    when git would read it as a header, and a section that holds anything git would parse as a new patch
    (text after its hunks, lines in no known form) is dropped as a whole.
    """

    def __init__(self, out: BinaryIO, max_bytes: int, skips: _Skips) -> None:
        self.out = out
        self.max_bytes = max_bytes
        self.skips = skips
        self.size = 0               # bytes kept so far: the position in out
        self.section_start = 0
        self.state = "preamble"
        self.dropping = True        # the current section (or text before the first one) is being discarded
        self.preamble = False       # there was text before the first `diff --git` line
        self.label = ""             # the current section's file, for the report
        self.head = bytearray()     # start of the current line, while it is shorter than _HEAD_MAX + 1
        self.in_tail = False        # past the head of a long line: pass bytes on until its newline
        self.old = self.new = 0     # lines still due in the current hunk
        self.no_eol_seen = False
        self.binary_hunks = 0
        self.mode_seen = False      # the current section said a mode (a mode line, or one on its index line)
        self.new_file = False       # the current section makes a new file
        self.deleted = False        # ...or deletes one
        self.last_deleted = ""      # the file the previous section deleted (git writes a type change as a deletion
        #                             and a new file, one after the other): its new file is no new file
        self.over = False           # the patch went over max_bytes in the current section: it is counted, not
        #                             written, until it ends (left out if a new file's alone is over: else too large)

    # -- splitting the stream into lines ---------------------------------------------------------------------
    def feed(self, block: bytes) -> None:
        pos, end = 0, len(block)
        while pos < end:
            if self.in_tail:
                newline = block.find(b"\n", pos)
                stop = end if newline < 0 else newline + 1
                self._emit(block[pos:stop])
                self.in_tail = newline < 0
                pos = stop
                continue
            if self.state == "hunk" and not self.head and not self.dropping:
                stop = self._hunk_run(block, pos)
                if stop > pos:
                    pos = stop
                    continue
            room = _HEAD_MAX + 1 - len(self.head)
            newline = block.find(b"\n", pos, pos + room)
            if newline >= 0:
                if self.head:
                    self.head += block[pos:newline + 1]
                    line = bytes(self.head)
                    self.head.clear()
                else:
                    line = block[pos:newline + 1]
                pos = newline + 1
                self._line(line, complete=True)
            else:
                take = min(room, end - pos)
                self.head += block[pos:pos + take]
                pos += take
                if len(self.head) > _HEAD_MAX:
                    line = bytes(self.head)
                    self.head.clear()
                    self.in_tail = True
                    self._line(line, complete=False)

    def _hunk_run(self, block: bytes, pos: int) -> int:
        """Fast path through a hunk body: take the whole lines of `block` from `pos` that _hunk_line would count,
        and pass them on in one write. Stops at the end of the hunk or before any other line, which goes the line
        by line way. Returns where it stopped."""
        old, new, start = self.old, self.new, pos
        find = block.find
        while old or new:
            newline = find(b"\n", pos)
            if newline < 0:
                break
            first = block[pos]
            if first == 0x2b:                   # +
                next_old, next_new = old, new - 1
            elif first == 0x2d:                 # -
                next_old, next_new = old - 1, new
            elif first == 0x20 or first == 0x0a:
                next_old, next_new = old - 1, new - 1
            else:
                break
            if next_old < 0 or next_new < 0:
                break
            old, new, pos = next_old, next_new, newline + 1
        if pos > start:
            self.old, self.new = old, new
            if not old and not new:
                self.state = "after_hunk"
            self._emit(block[start:pos])
        return pos

    def finish(self) -> None:
        if self.head or self.in_tail:          # the last line has no newline: git diff never ends so
            if self.head:
                self._line(bytes(self.head), complete=True)
                self.head.clear()
            self._drop("no newline at the end of the patch")
        self._end_section()
        if self.preamble:
            self.skips.add("(text before the first diff --git line)", "not part of any file section")
            self.preamble = False
        self.out.flush()

    # -- sections --------------------------------------------------------------------------------------------
    def _line(self, line: bytes, complete: bool) -> None:
        if line.startswith(b"diff --git "):
            self._end_section()
            self._start_section(line, complete)
        elif self.state == "preamble":
            self.preamble = True
        elif not self.dropping:
            self._section_line(line, complete)
        self._emit(line)

    def _emit(self, data: bytes) -> None:
        if self.dropping:
            return
        self.size += len(data)
        if self.size > self.max_bytes or self.over:
            # A new file that alone is over the limit (a generated or binary file, as a rule) is left out and the rest
            # kept; past the limit otherwise, the patch is too large (said as its section ends).
            self.over = True
            if self.size - self.section_start > self.max_bytes and self.new_file:
                self._drop(new_file_over(self.max_bytes))
            return
        self.out.write(data)

    def _mode_stated(self) -> None:
        """A change to a file's content must say the file's mode, as pid's git always does (on its index line, or as
        a new or deleted file's): without one git apply keeps the file's own type, so a forged hunk could retarget a
        link the workspace has."""
        if not self.mode_seen:
            self._drop("a change that does not say the file's mode (it could retarget a link)")

    def _refuse_mode(self, mode: bytes) -> None:
        why = _file_type(mode)
        if why is not None:
            self._drop(why)

    def _drop(self, reason: str, name: str | None = None) -> None:
        if self.dropping:
            return
        self.dropping = True
        self.over = False
        self.out.seek(self.section_start)
        self.out.truncate()
        self.size = self.section_start
        self.skips.add(self.label if name is None else name, reason)

    def _end_section(self) -> None:
        if self.state == "hunk":
            self._drop("hunk cut short")
        elif self.state not in _SECTION_ENDS and self.state != "preamble":
            self._drop("binary patch cut short")
        if self.over:
            raise ArtifactTooLarge(
                f"the patch is over the {_size_text(self.max_bytes)} limit (--max-patch), without the new files "
                "too large for it alone: many generated files, or a large change to a file the workspace had, are "
                "the usual cause (remove or .gitignore them in the task, or raise --max-patch)")

    def _start_section(self, line: bytes, complete: bool) -> None:
        if self.preamble:
            self.skips.add("(text before the first diff --git line)", "not part of any file section")
            self.preamble = False
        self.last_deleted = self.label if self.deleted and not self.dropping else ""
        self.state = "header"
        self.dropping = False
        self.mode_seen = False
        self.new_file = self.deleted = False
        self.section_start = self.size
        rest = line[len(b"diff --git "):].rstrip(b"\n")
        self.label = _decode(rest)
        if not complete:
            self._drop("header line over 8 KiB")
            return
        pairs = _diff_git_names(rest)
        if pairs is None:
            self._drop("malformed diff --git line")
            return
        self.label = _decode(pairs[0][1][2:])
        for a_name, b_name in pairs:
            for raw in (a_name[2:], b_name[2:]):
                if self._refuse_name(raw):
                    return

    def _refuse_name(self, raw: bytes) -> bool:
        name = _decode(raw)
        reason = unsafe_path_reason(name)
        if reason is not None:
            self._drop(reason, name)
        return reason is not None

    def _section_line(self, line: bytes, complete: bool) -> None:
        state = self.state
        if state == "hunk":
            self._hunk_line(line)
            return
        if not complete:
            self._drop("header line over 8 KiB")
        elif line.startswith(b"@@ -") and state in ("header", "after_hunk"):
            if state == "header":
                self._mode_stated()
            self._start_hunk(line)
        elif state == "header":
            self._header_line(line)
        elif state == "after_hunk" and line.startswith(b"\\ ") and not self.no_eol_seen:
            self.no_eol_seen = True             # "\ No newline at end of file" after the hunk's last line
        elif state == "binary_data" and line != b"\n" and _base85_line_ok(line):
            pass
        elif state == "binary_data" and line == b"\n":
            self.state = "binary_gap"
        elif state in ("binary", "binary_gap") and self.binary_hunks < 2 and _BINARY_HUNK.fullmatch(line):
            self.binary_hunks += 1
            self.state = "binary_data"
        elif state.startswith("binary"):
            self._drop("malformed binary patch")
        else:
            self._drop("unexpected line after the hunks")

    def _start_hunk(self, line: bytes) -> None:
        match = _HUNK_HEADER.match(line)
        if match is None:
            self._drop("malformed hunk header")
            return
        self.old = 1 if match[1] is None else int(match[1])
        self.new = 1 if match[2] is None else int(match[2])
        self.no_eol_seen = False
        self.state = "hunk" if self.old or self.new else "after_hunk"

    def _hunk_line(self, line: bytes) -> None:
        first = line[0]
        if first == 0x20 or first == 0x0a:      # context (an empty line is context to git apply too)
            self.old -= 1
            self.new -= 1
        elif first == 0x2d:                     # -
            self.old -= 1
        elif first == 0x2b:                     # +
            self.new -= 1
        elif first == 0x5c and line.startswith(b"\\ "):
            return
        else:
            self._drop("malformed hunk")
            return
        if self.old < 0 or self.new < 0:
            self._drop("hunk longer than its header says")
        elif self.old == 0 and self.new == 0:
            self.state = "after_hunk"

    def _header_line(self, line: bytes) -> None:
        text = line[:-1] if line.endswith(b"\n") else line
        if text.startswith((b"--- ", b"+++ ")):
            rest = text[4:]
            if rest.endswith(b"\t"):            # git ends a name holding a space with a tab (as GNU diff does)
                rest = rest[:-1]
            if rest == b"/dev/null":
                return
            name = _one_name(rest)
            prefix = b"a/" if text.startswith(b"-") else b"b/"
            if name is None or not name.startswith(prefix):
                self._drop("malformed file name line")
            else:
                self._refuse_name(name[2:])
        elif text.startswith(_BARE_NAME_LINES):
            name = _one_name(text.split(b" ", 2)[2])
            if name is None:
                self._drop("malformed file name line")
            else:
                self._refuse_name(name)
                self._drop(RENAMED)   # (a safe name's section goes too; the first reason found is the one kept)
        elif match := _MODE_LINE.fullmatch(text):
            self.mode_seen = True
            self.new_file = self.new_file or (match[1] == b"new file mode" and self.label != self.last_deleted)
            self.deleted = self.deleted or match[1] == b"deleted file mode"
            if match[1] in (b"new mode", b"new file mode"):
                self._refuse_mode(match[2])
        elif match := _INDEX_LINE.fullmatch(text):
            # (the mode of an entry changed in place: a submodule the workspace has may move to another commit)
            self.mode_seen = self.mode_seen or match[1] is not None
            if match[1] is not None and int(match[1], 8) & 0o170000 != 0o160000:
                self._refuse_mode(match[1])
        elif _SIMILARITY_LINE.fullmatch(text):
            pass
        elif text == b"GIT binary patch":
            self._mode_stated()
            self.state = "binary"
            self.binary_hunks = 0
        elif text.startswith(b"Binary files ") and text.endswith(b" differ"):
            self._mode_stated()
            self.state = "end"
        else:
            self._drop("unexpected line in the header")


def _file_type(mode: bytes) -> str | None:
    """Why a file of this mode may not come out of a patch, or None for a regular file's. git apply reads a mode by
    its file-type bits alone (120755 makes a symlink as 120000 does, 160644 a nested repository), so the type is
    what is judged, not the digits as git itself writes them; only a regular file's passes."""
    kind = int(mode, 8) & 0o170000
    if kind == 0o100000:
        return None
    return {0o120000: "symlink", 0o160000: NEW_REPOSITORY}.get(kind, "a mode git does not write")


def _base85_line_ok(line: bytes) -> bool:
    """A line of a GIT binary patch: a length letter, then exactly the base85 groups that length needs."""
    if not _BASE85_LINE.fullmatch(line):
        return False
    first = line[0]
    length = first - 0x40 if first <= 0x5a else first - 0x60 + 26
    return len(line) - 2 == (length + 3) // 4 * 5


# -- files -----------------------------------------------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused(Exception):
    """This member cannot be made on the host (the message is the reason); the archive goes on."""


class _CutShort(Exception):
    """The member's data ended early; the archive ends with it."""


PASS_OVER_AT_LEAST = 64 << 20   # skipped file data read past before the rest of an archive is given up


def extract_files(chunks: Iterable[bytes], dest_dir: str, *, max_bytes: int, max_entries: int,
                  budget: FilesBudget | None = None) -> FilesCopy:
    """Extract the regular files and directories of the tar stream under dest_dir; everything else, unsafe
    names and whatever is over the limits is skipped and listed (at most 100 entries plus a summary).

    With `budget`, its limits and counts are used and updated instead of max_bytes and max_entries. Problems of
    the archive end the extraction with a Skipped entry; host errors (disk full) are raised. No partial file is
    ever left. Regular files skipped are read past only up to max_bytes of data (PASS_OVER_AT_LEAST at least, so
    that one file over a small limit does not cost the smaller ones after it): a huge (say sparse) file past that
    ends the reading, so the stream read stays within about twice the limit (or the limit and that floor).
    """
    budget = budget if budget is not None else FilesBudget(max_bytes, max_entries)
    result = FilesCopy(written=[], skipped=[], total_bytes=0)
    skips = _Skips(result.skipped)
    os.makedirs(dest_dir, exist_ok=True)
    root = os.open(dest_dir, _DIR_FLAGS)
    unread = False
    try:
        extractor = _Extractor(root, dest_dir, budget, result, skips)
        with contextlib.closing(_open_tar(chunks)) as tar:
            for member in _members(tar):
                if not extractor.take(tar, member):
                    unread = True
                    break
    except _CutShort as exc:
        skips.add(str(exc), "archive cut short")
    except (tarfile.TarError, RecursionError) as exc:
        skips.add("(archive)", f"unreadable archive: {exc}")
    finally:
        os.close(root)
        skips.close(unread)
    return result


class _Extractor:
    """Makes the members of one extract_files call under an open dest_dir descriptor."""

    def __init__(self, root: int, dest_dir: str, budget: FilesBudget, result: FilesCopy, skips: _Skips) -> None:
        self.root = root
        self.dest_dir = dest_dir
        self.budget = budget
        self.result = result
        self.skips = skips
        self.passed_over = 0        # data bytes of members skipped in this call

    def take(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
        """Write or skip one member; False when the rest of the archive is not worth reading."""
        parts = [part for part in member.name.split("/") if part not in ("", ".")]
        if member.isdir() and not parts and not member.name.startswith("/"):
            return True                         # "." is dest_dir itself
        reason = self.budget.stopped or _refusal(member)
        if reason is None:
            try:
                self._make(tar, member, parts)
                return True
            except _Refused as exc:
                reason = str(exc)
        self.skips.add(member.name, reason)
        self.passed_over += _data_size(member)
        return self.passed_over <= max(self.budget.max_bytes, PASS_OVER_AT_LEAST)

    def _stop(self, reason: str) -> _Refused:
        self.budget.stopped = reason
        return _Refused(reason)

    def _need_entry(self) -> None:
        if self.budget.used_entries >= self.budget.max_entries:
            raise self._stop(f"over the {self.budget.max_entries}-entry limit")

    def _made(self, parts: list[str], size: int = 0) -> None:
        self.budget.used_entries += 1
        self.budget.used_bytes += size
        self.result.total_bytes += size
        self.result.written.append(os.path.join(self.dest_dir, *parts))

    def _make(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        self._need_entry()
        if member.isdir():
            os.close(self._open_dirs(parts))
            return
        if self.budget.used_bytes + member.size > self.budget.max_bytes:   # (a smaller file after it may still fit)
            limit = f"over the {_size_text(self.budget.max_bytes)} limit"
            alone = member.size > self.budget.max_bytes
            raise _Refused(limit if alone else f"{limit} with the files collected before it")
        parent = self._open_dirs(parts[:-1])
        try:
            self._need_entry()
            mode = 0o755 if member.mode & 0o111 else 0o644
            out = os.fdopen(_host(os.open, parts[-1], _FILE_FLAGS, mode, dir_fd=parent), "wb", buffering=_BLOCK)
            try:
                with out:
                    size = _copy(_regular(tar, member), out, member)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(parts[-1], dir_fd=parent)
                raise
            self._made(parts, size)
        finally:
            os.close(parent)

    def _open_dirs(self, parts: list[str]) -> int:
        """A descriptor for dest_dir/parts, each component opened without following links, made if missing."""
        fd = os.dup(self.root)
        try:
            for i, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    self._need_entry()
                    _host(os.mkdir, part, 0o755, dir_fd=fd)
                    self._made(parts[:i + 1])
                    child = _host(os.open, part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _Refused(_in_the_way(exc, part, fd)) from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd


def _refusal(member: tarfile.TarInfo) -> str | None:
    reason = unsafe_path_reason(member.name)
    if reason is not None or member.isreg() or member.isdir():
        return reason
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hard link"
    return "special file"


def _host(call, *args, **kwargs):
    """`call` (an os.open or os.mkdir under dest_dir); an OSError means this member cannot be made here."""
    try:
        return call(*args, **kwargs)
    except OSError as exc:
        raise _Refused(_host_reason(exc)) from None


def _in_the_way(exc: OSError, part: str, dir_fd: int) -> str:
    """Why directory `part` could not be opened (Linux says ENOTDIR for a symlink opened O_DIRECTORY)."""
    if exc.errno == errno.ENOTDIR:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(part, dir_fd=dir_fd).st_mode):
                return "a symlink on the host is in the way"
    return _host_reason(exc)


def _host_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink on the host is in the way"
    if exc.errno == errno.EEXIST:
        return "already exists"
    if exc.errno == errno.ENOTDIR:
        return "a file on the host is in the way"
    return f"cannot create: {exc.strerror or exc}"


def _copy(source: BinaryIO, out: BinaryIO, member: tarfile.TarInfo) -> int:
    """Member data into out; _CutShort if the stream ends first. Write errors are raised."""
    size = 0
    while True:
        try:
            block = source.read(min(_BLOCK, member.size - size))
        except tarfile.TarError:
            raise _CutShort(member.name) from None
        if not block:
            break
        out.write(block)
        size += len(block)
    if size != member.size:
        raise _CutShort(member.name)
    return size
