"""The one sanitiser (pid/terminal.py): what a terminal acts on never reaches it, what it only shows stays, --json is
exact; and every command's output goes through it (cli/output.py's echo is the only writer)."""
from __future__ import annotations

import io
import os
import json
import logging
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from pid.terminal import ShownLogRecords, dumps, escaped, one_line, shown, strip_escapes

ROOT = Path(__file__).resolve().parent.parent

# What a hostile model, server or task writes to take over a terminal (issue 21, finding 4), each with what the
# user must see of it instead.
HOSTILE = {
    "osc52 clipboard": ("a\x1b]52;c;cm0gLXJmIH4K\x07b", "ab"),
    "osc52 st": ("a\x1b]52;c;cm0gLXJmIH4K\x1b\\b", "ab"),
    "window title": ("\x1b]0;pwned\x07title", "title"),
    "osc8 hyperlink": ("\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\", "click me"),
    "cursor up, erase line": ("x\x1b[1A\x1b[2K\r\x1b[32mcompleted\x1b[0m", "xcompleted"),
    "c1 csi": ("x\u009b1A\u009b2Kcompleted", "xcompleted"),
    "c1 osc": ("x\u009d0;title\u009cy", "xy"),
    "dcs": ("x\x1bPq#0;2;0;0;0\x1b\\y", "xy"),
    "bidi override": ("invoice_\u202egpj.exe", "invoice_gpj.exe"),
    "bidi isolate": ("a\u2066b\u2069c\u200fd", "abcd"),
    "zero width": ("pa\u200bss\ufeffword", "password"),
    "line separator": ("one\u2028two\u2029", "onetwo"),
    "bell, backspace, del": ("a\x07b\x08c\x7fd", "abcd"),
    "lone surrogate": ("bad\udcffname", "bad\ufffdname"),
    "astral tag characters": ("flag\U000e0067\U000e0062", "flag"),
}


def _unsafe(text: str, allow: str = "\n\t") -> list[str]:
    return [c for c in text if c not in allow and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


@pytest.mark.parametrize("name", HOSTILE)
def test_shown_removes_what_a_terminal_acts_on(name):
    raw, expected = HOSTILE[name]
    assert shown(raw) == expected
    assert not _unsafe(shown(raw))
    assert not _unsafe(one_line(raw), allow="")


def test_shown_keeps_printable_text_newlines_and_tabs():
    text = "héllo wörld — 中文 😀 ✓ …\n\tindented\n"
    assert shown(text) == text
    assert shown("a\r\nb") == "a\nb"   # a carriage return could overwrite what pid wrote


def test_an_unterminated_sequence_hides_nothing_after_it():
    assert shown("a\x1b]0;title\nb") == "a0;title\nb"          # no terminator on its line: only the introducer goes
    assert shown("id\x1b]8;;") + " failed" == "id8;; failed"
    assert shown("a\x1b[") == "a"


def test_strip_escapes_keeps_format_characters_for_the_model():
    """Command output as the model sees it: escapes and controls go, the text's own characters stay."""
    assert strip_escapes("a\x1b[2K\rb\x1b(Bc\x00d\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \u202e") == "abcdlink \u202e"


def test_one_line_flattens_whitespace():
    assert one_line("  error:\n  completed (stop)\t✓ check passed \n") == "error: completed (stop) ✓ check passed"


def test_escaped_names_are_unambiguous_and_bounded():
    assert escaped("\x1b[31mred\n\t\\") == "\\x1b[31mred\\n\\t\\\\"
    assert escaped("bidi\u202eexe.txt") == "bidi\\u202eexe.txt"
    assert escaped("raw\udc9b") == "raw\\x9b"
    assert escaped("c1\u009b") == "c1\\x9b"
    assert escaped("tag\U000e0067") == "tag\\U000e0067"
    long = escaped("\x1b" * 1000)
    assert len(long) <= 300 and long.endswith("…") and "\x1b" not in long
    assert escaped("a" * 300) == "a" * 300
    assert len(escaped("a" * 301)) == 300


def test_dumps_is_exact_json_and_safe_on_a_terminal():
    value = {name: raw for name, (raw, _) in HOSTILE.items()}
    value["readable"] = "héllo 中文 😀"
    value["nested"] = [{"k\u202e": "\u009b2K"}, 1, None, True]
    for indent in (None, 2):
        text = dumps(value, indent=indent)
        assert json.loads(text) == value
        assert not _unsafe(text, allow="\n")
        assert "héllo 中文 😀" in text   # readable text stays readable
    assert "\u009b" in json.dumps(value, ensure_ascii=False)   # why dumps exists: json.dumps leaves C1 raw


def test_log_records_are_shown():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(ShownLogRecords())
    logger = logging.getLogger("pid.test-terminal")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("job %s: %s", "j1", "model said \x1b]52;c;Zm9v\x07\x1b[2Khi")
        try:
            raise RuntimeError("server: \u009b1A\x1b]0;title\x07boom")
        except RuntimeError:
            logger.exception("failed \u202e")
        logger.warning("bad %d format", "x")   # a record whose arguments do not fit is still sanitised
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert not _unsafe(text)
    assert "job j1: model said hi" in text and "RuntimeError: server: boom" in text


# -- every command's output goes through the sanitiser ---------------------------------------------------------

_WRITERS = re.compile(r"click\.(?:echo|secho)\(|\bprint\(|\.stdout\.write\(|\.stderr\.write\(|\bconsole\.print\(")


def test_cli_output_echo_is_the_only_writer():
    """Outside cli/output.py's echo, a command writes to the terminal only through pid.terminal: a rich console's
    print (the batch's live table) and a worker's one print take `shown` text."""
    found = []
    for package in ("cli", "jobs", "worker", "pid", "sandbox"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _WRITERS.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    allowed = [f for f in found if f.startswith("cli/output.py:") or "(shown(" in f]
    assert found == allowed, "\n".join(set(found) - set(allowed))
    assert len([f for f in found if f.startswith("cli/output.py:")]) == 1


def test_one_sanitiser():
    """Escape sequences are matched in one module: no other keeps its own pattern for them."""
    elsewhere = [str(p.relative_to(ROOT)) for package in ("cli", "jobs", "worker", "pid", "sandbox")
                 for p in (ROOT / package).rglob("*.py")
                 if p.name != "terminal.py" and re.search(r"\\x1b|\\033|\\x9b|isprintable\(\) else", p.read_text())]
    assert elsewhere == []


def test_a_workers_celery_log_goes_through_the_sanitiser(tmp_path):
    """`pid worker`'s Celery handlers, made as the worker starts, get the filter too (worker/tasks.py)."""
    code = ("import logging\n"
            "from pid.worker.tasks import configure_job_lines\n"
            "from pid.worker.app import app\n"
            "configure_job_lines()\n"
            "app.log.setup(loglevel='WARNING')\n"
            "logging.getLogger('pid.worker').warning('job %s', '\\x1b]0;title\\x07j1\\u202e\\u009b2K')\n"
            "logging.getLogger('pid.jobs').info('started: %s', '\\x1b[1A\\x1b[2Kfake')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PID_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "job j1" in proc.stderr and "started: fake" in proc.stderr and not _unsafe(proc.stderr), proc.stderr
