"""edit through the registry, against the in-memory sandbox and a real container (see tests/tool_sandbox.py)."""
from __future__ import annotations

import json
import threading

import pytest

from pid.messages import TextContent
from pid.tools import ToolContext, default_registry
from pid.messages import ToolCall
from tests.tool_sandbox import call_tool, get, put


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def edit(box, path, *pairs, **extra):
    args = {"path": path, **extra}
    if pairs:
        args["edits"] = [{"oldText": o, "newText": n} for o, n in pairs]
    return call_tool(box, "edit", args)


def test_exact_edit_with_diff_details(sandbox):
    put(sandbox, "f.py", "def f():\n    return 1\n\nprint(f())\n")
    result = edit(sandbox, "f.py", ("return 1", "return 2"))
    assert not result.is_error and text(result) == "Successfully replaced 1 block(s) in f.py."
    assert get(sandbox, "f.py") == b"def f():\n    return 2\n\nprint(f())\n"
    assert result.details["firstChangedLine"] == 2
    assert "-    return 1\n+    return 2" in result.details["diff"]
    assert result.details["diff"].startswith("--- a/f.py\n+++ b/f.py\n")


def test_several_edits_match_the_original(sandbox):
    put(sandbox, "abc.txt", "a\nb\nc\n")
    result = edit(sandbox, "abc.txt", ("a\n", "b\n"), ("b\n", "c\n"))
    assert text(result) == "Successfully replaced 2 block(s) in abc.txt."
    assert get(sandbox, "abc.txt") == b"b\nc\nc\n"


FUZZY_CASES = [
    # (file, oldText, newText, expected file)
    ("a = 1   \nb = 2\nc = 3  \n", "a = 1\nb = 2", "a = 10\nb = 20", "a = 10\nb = 20\nc = 3  \n"),
    ("x\u00a0= 1\nkeep\u00a0this\n", "x = 1", "x = 2", "x = 2\nkeep\u00a0this\n"),
    ("print(“hi”)\nsay(‘yo’)\n", 'print("hi")', 'print("bye")', 'print("bye")\nsay(‘yo’)\n'),
    ("a – b\nc — d\n", "a - b", "a + b", "a + b\nc — d\n"),
    ("x = a — b\ny = c – d\n", "x = a - b", "x = a", "x = a\ny = c – d\n"),
    ("ＡＢＣ = 1\nＤ\n", "ABC = 1", "abc = 2", "abc = 2\nＤ\n"),
    ("  if x:\u3000\n    y()  \n  z()\u00a0\n", "if x:\n    y()", "if x:\n    w()",
     "  if x:\n    w()  \n  z()\u00a0\n"),
]


@pytest.mark.parametrize("original,old,new,expected", FUZZY_CASES)
def test_fuzzy_edit_keeps_other_lines_byte_identical(sandbox, original, old, new, expected):
    put(sandbox, "fuzzy.txt", original)
    result = edit(sandbox, "fuzzy.txt", (old, new))
    assert not result.is_error, text(result)
    assert get(sandbox, "fuzzy.txt") == expected.encode()


def test_fuzzy_edit_leaves_undecodable_bytes_elsewhere_alone(sandbox):
    put(sandbox, "mixed.txt", b"caf\xe9\nsay(\xe2\x80\x9chi\xe2\x80\x9d)\n\xff\xfe end\n")
    result = edit(sandbox, "mixed.txt", ('say("hi")', 'say("ho")'))
    assert not result.is_error, text(result)
    assert get(sandbox, "mixed.txt") == b'caf\xe9\nsay("ho")\n\xff\xfe end\n'


def test_duplicates_counted_after_normalisation(sandbox):
    put(sandbox, "dup.txt", "a\u00a0b\na\u2009b\n")
    result = edit(sandbox, "dup.txt", ("a b", "c"))
    assert result.is_error
    assert text(result) == ("Found 2 occurrences of the text in dup.txt. The text must be unique. "
                            "Please provide more context to make it unique.")


def test_exact_duplicates(sandbox):
    put(sandbox, "dup2.txt", "x = 1\nx = 1\n")
    assert text(edit(sandbox, "dup2.txt", ("x = 1", "x = 2"))).startswith("Found 2 occurrences")
    assert get(sandbox, "dup2.txt") == b"x = 1\nx = 1\n"


def test_crlf_preserved(sandbox):
    put(sandbox, "win.txt", b"one\r\ntwo\r\nthree\r\n")
    result = edit(sandbox, "win.txt", ("one\ntwo", "uno\ndos\ntres"))
    assert not result.is_error, text(result)
    assert get(sandbox, "win.txt") == b"uno\r\ndos\r\ntres\r\nthree\r\n"


def test_mixed_line_endings_outside_the_edit_untouched(sandbox):
    put(sandbox, "mixed.txt", b"a\r\nb\nc\r\n")
    edit(sandbox, "mixed.txt", ("b", "B"))
    assert get(sandbox, "mixed.txt") == b"a\r\nB\nc\r\n"


def test_bom_preserved(sandbox):
    put(sandbox, "bom.txt", b"\xef\xbb\xbfhello\nworld\n")
    result = edit(sandbox, "bom.txt", ("hello", "howdy"))
    assert not result.is_error
    assert get(sandbox, "bom.txt") == b"\xef\xbb\xbfhowdy\nworld\n"


def test_overlapping_edits_rejected(sandbox):
    put(sandbox, "o.txt", "abcdef\n")
    result = edit(sandbox, "o.txt", ("abc", "X"), ("cde", "Y"))
    assert result.is_error
    assert text(result) == ("edits[0] and edits[1] overlap in o.txt. Merge them into one edit or target "
                            "disjoint regions.\n\nNone of the 2 edits were applied.")
    assert get(sandbox, "o.txt") == b"abcdef\n"


def test_adjacent_edits_are_not_overlapping(sandbox):
    put(sandbox, "adj.txt", "abcdef\n")
    assert not edit(sandbox, "adj.txt", ("def", "DEF"), ("abc", "ABC")).is_error
    assert get(sandbox, "adj.txt") == b"ABCDEF\n"


SOURCE = "import os\n\n\ndef greet(name):\n    message = 'hello ' + name\n    return message\n\n\nprint(greet('x'))\n"


def test_not_found_shows_the_closest_match(sandbox):
    put(sandbox, "g.py", SOURCE)
    result = edit(sandbox, "g.py", ("def greet(nam):\n    message = 'hi ' + name", "x"))
    assert result.is_error
    assert text(result) == (
        "Could not find the exact text in g.py. The old text must match exactly including all whitespace and "
        "newlines.\n\nClosest match is around line 4:\n"
        "4\tdef greet(name):\n5\t    message = 'hello ' + name\n6\t    return message\n7\t")


def test_not_found_without_anything_close_shows_the_start(sandbox):
    put(sandbox, "g.py", SOURCE)
    result = edit(sandbox, "g.py", ("zzzzqqqq", "x"))
    assert text(result) == (
        "Could not find the exact text in g.py. The old text must match exactly including all whitespace and "
        "newlines.\n\nFile starts with:\n1\timport os\n2\t\n3\t\n4\tdef greet(name):\n5\t    message = 'hello ' + name")


def test_errors_name_the_edit_when_there_are_several(sandbox):
    put(sandbox, "s.txt", "alpha\nbeta\n")
    result = edit(sandbox, "s.txt", ("alpha", "A"), ("gamma", "G"), ("", "E"))
    lines = text(result).split("\n\n")
    assert lines[0] == ("edits[1]: Could not find the exact text in s.txt. The old text must match exactly "
                        "including all whitespace and newlines.")
    assert "edits[2]: oldText must not be empty in s.txt." in lines
    assert lines[-1] == "None of the 3 edits were applied."
    assert get(sandbox, "s.txt") == b"alpha\nbeta\n"


def test_empty_old_text(sandbox):
    put(sandbox, "e.txt", "x\n")
    assert text(edit(sandbox, "e.txt", ("", "y"))) == "oldText must not be empty in e.txt."


def test_no_change(sandbox):
    put(sandbox, "n.txt", "same\n")
    result = edit(sandbox, "n.txt", ("same", "same"))
    assert result.is_error
    assert text(result) == "No changes made to n.txt. The replacement produced identical content."


def test_legacy_top_level_old_and_new_text(sandbox):
    put(sandbox, "l.txt", "old line\n")
    result = call_tool(sandbox, "edit", {"path": "l.txt", "oldText": "old", "newText": "new"})
    assert text(result) == "Successfully replaced 1 block(s) in l.txt."
    assert get(sandbox, "l.txt") == b"new line\n"


def test_edits_as_a_json_string(sandbox):
    put(sandbox, "j.txt", "one two\n")
    edits = json.dumps([{"oldText": "one", "newText": "1"}, {"oldText": "two", "newText": "2"}])
    result = call_tool(sandbox, "edit", {"path": "@j.txt", "edits": edits})
    assert text(result) == "Successfully replaced 2 block(s) in j.txt."
    assert get(sandbox, "j.txt") == b"1 2\n"


def test_missing_file_and_bad_arguments(sandbox):
    assert text(edit(sandbox, "missing.txt", ("a", "b"))) == "Could not edit file: missing.txt. Error code: ENOENT."
    result = call_tool(sandbox, "edit", {"path": "x", "edits": [{"oldText": "a"}]})
    assert text(result).startswith(
        'Validation failed for tool "edit":\n  - edits/0/newText: must have required property \'newText\'')


def test_concurrent_edits_to_one_file_are_serialised(sandbox):
    tokens = [f"token{i:02d}" for i in range(12)]
    put(sandbox, "c.txt", "\n".join(tokens) + "\n")
    results = []
    threads = [threading.Thread(target=lambda t=t: results.append(edit(sandbox, "c.txt", (t, t.upper()))))
               for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(r.is_error for r in results)
    assert get(sandbox, "c.txt") == ("\n".join(t.upper() for t in tokens) + "\n").encode()


def test_legacy_fields_alongside_edits_become_one_more_edit(sandbox):
    put(sandbox, "both.txt", "one two\n")
    result = call_tool(sandbox, "edit", {"path": "both.txt", "edits": '[{"oldText": "one", "newText": "1"}]',
                                         "oldText": "two", "newText": "2"})
    assert text(result) == "Successfully replaced 2 block(s) in both.txt."
    assert get(sandbox, "both.txt") == b"1 2\n"


def test_edits_through_a_symlink_and_its_target_are_serialised(docker_sandbox):  # needs a real shell
    sandbox = docker_sandbox
    tokens = [f"word{i:02d}" for i in range(16)]
    put(sandbox, "target.txt", "\n".join(tokens) + "\n")
    sandbox.exec("mkdir -p sub && ln -sfn target.txt link.txt", timeout=10)
    names = ["link.txt", "target.txt", "sub/../target.txt", f"{sandbox.workdir}/link.txt"]
    results = []
    threads = [threading.Thread(target=lambda i=i, t=t: results.append(
        edit(sandbox, names[i % len(names)], (t, t.upper())))) for i, t in enumerate(tokens)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(r.is_error for r in results), [text(r) for r in results if r.is_error]
    assert get(sandbox, "target.txt") == ("\n".join(t.upper() for t in tokens) + "\n").encode()


def test_empty_edits_directory_and_permissions_keep_pi_wording(docker_sandbox):  # needs a real shell
    sandbox = docker_sandbox
    put(sandbox, "any.txt", "x\n")
    assert text(call_tool(sandbox, "edit", {"path": "any.txt", "edits": []})) == (
        "Edit tool input is invalid. edits must contain at least one replacement.")
    sandbox.exec("mkdir -p adir && printf 'x\\n' > locked.txt && chmod 000 locked.txt && "
                 "printf 'x\\n' > readonly.txt && chmod 444 readonly.txt", timeout=10)
    assert text(edit(sandbox, "adir", ("x", "y"))) == f"EISDIR: Is a directory, read '{sandbox.workdir}/adir'"
    assert text(edit(sandbox, "locked.txt", ("x", "y"))) == "Could not edit file: locked.txt. Error code: EACCES."
    assert text(edit(sandbox, "readonly.txt", ("x", "y"))) == "Could not edit file: readonly.txt. Error code: EACCES."
    assert get(sandbox, "readonly.txt") == b"x\n"


class CancelAfterWrite:
    """A sandbox that is cancelled while its write is under way (the write still lands, as a cancel cannot
    unwrite it): pi fails the call all the same."""

    def __init__(self, inner, cancel):
        self.inner, self.workdir, self.cancel = inner, inner.workdir, cancel

    def exec(self, *args, **kwargs):
        return self.inner.exec(*args, **kwargs)

    def read_file(self, *args, **kwargs):
        return self.inner.read_file(*args, **kwargs)

    def write_file(self, path, data, **kwargs):
        self.inner.write_file(path, data)
        self.cancel.set()


@pytest.mark.parametrize("tool", ["edit", "write"])
def test_cancel_fails_edit_and_write_with_pi_text(sandbox, tool):
    put(sandbox, f"cancel-{tool}.txt", "before\n")
    args = {"path": f"cancel-{tool}.txt"}
    args.update({"edits": [{"oldText": "before", "newText": "after"}]} if tool == "edit" else {"content": "after\n"})
    cancelled = threading.Event()
    cancelled.set()
    early = default_registry().execute(ToolCall("c1", tool, args), ToolContext(sandbox, cancel=cancelled))
    assert early.is_error and text(early) == "Operation aborted"
    assert get(sandbox, f"cancel-{tool}.txt") == b"before\n"

    during = threading.Event()
    late = default_registry().execute(ToolCall("c2", tool, args),
                                      ToolContext(CancelAfterWrite(sandbox, during), cancel=during))
    assert late.is_error and text(late) == "Operation aborted"


def test_patch_applies_to_the_original_file(docker_sandbox):  # needs a real shell
    sandbox = docker_sandbox
    original = b"\xef\xbb\xbfone\r\ntwo\r\nthree\r\nfour\r\nfive\r\nsix\r\nseven\r\neight\r\nnine\r\nlast"
    put(sandbox, "p.txt", original)
    result = edit(sandbox, "p.txt", ("two", "TWO"), ("last", "LAST\nmore"))
    assert not result.is_error, text(result)
    edited = get(sandbox, "p.txt")
    patch = result.details["patch"]
    assert patch.startswith("--- p.txt\n+++ p.txt\n@@ ")
    put(sandbox, "p.txt", original)
    put(sandbox, "p.diff", patch)
    applied = sandbox.exec("patch -p0 --quiet < p.diff", timeout=30)
    assert applied.exit_code == 0, applied.tail
    assert get(sandbox, "p.txt") == edited == (b"\xef\xbb\xbfone\r\nTWO\r\nthree\r\nfour\r\nfive\r\nsix\r\n"
                                               b"seven\r\neight\r\nnine\r\nLAST\r\nmore")
