"""Artifacts for `pid view`'s tests, in the shapes pid writes them: a job directory (result.json with a check,
session.jsonl in pi's version-3 format, patch.diff) whose transcript is hostile (HTML and script in every field the
agent writes), and a batch directory (batch.jsonl, summary.json, one folder per item) as `pid batch --out` writes.

A script that ran would mark the page: PWNED_ATTR appears as an attribute of <body> only if one did.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PWNED_ATTR = 'data-pwned="yes"'
SCRIPT = "<script>document.body.setAttribute('data-pwned','yes')</script>"
HOSTILE = f"</details></pre></div>{SCRIPT}<img src=x onerror=\"document.body.setAttribute('data-pwned','yes')\">"

PATCH = """diff --git a/hello.py b/hello.py
index 1111111..2222222 100644
--- a/hello.py
+++ b/hello.py
@@ -1 +1 @@
-print("hello")
+print("hello, pid")  # </details><script>x</script>
diff --git a/notes/new.txt b/notes/new.txt
new file mode 100644
--- /dev/null
+++ b/notes/new.txt
@@ -0,0 +1 @@
+made by the agent
"""

EDIT_PATCH = """--- hello.py
+++ hello.py
@@ -1 +1 @@
-print("hello")
+print("hello, pid")
"""


class SessionBuilder:
    """Entries chained by parentId, as pid/session.py and pi write them."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = [{"type": "session", "version": 3, "id": "s-1",
                                             "timestamp": "2026-11-30T10:00:00.000Z", "cwd": "/workspace"}]
        self.last: str | None = None
        self.n = 0

    def add(self, body: dict[str, Any], parent: str | None = "last") -> str:
        self.n += 1
        entry_id = f"e{self.n:07x}"
        self.lines.append({"type": body.pop("type", "message"), "id": entry_id,
                           "parentId": self.last if parent == "last" else parent,
                           "timestamp": "2026-11-30T10:00:01.000Z", **body})
        self.last = entry_id
        return entry_id

    def user(self, text: str) -> str:
        return self.add({"message": {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}})

    def assistant(self, *blocks: dict[str, Any], stop: str = "toolUse", cost: float = 0.001) -> str:
        return self.add({"message": {"role": "assistant", "content": list(blocks), "api": "openai-completions",
                                     "provider": "openai", "model": "scripted",
                                     "usage": {"input": 100, "output": 20, "cacheRead": 0, "cacheWrite": 0,
                                               "totalTokens": 120, "cost": {"total": cost}},
                                     "stopReason": stop, "timestamp": 2}})

    def result(self, call_id: str, name: str, text: str, is_error: bool = False,
               details: dict[str, Any] | None = None) -> str:
        message: dict[str, Any] = {"role": "toolResult", "toolCallId": call_id, "toolName": name,
                                   "content": [{"type": "text", "text": text}], "isError": is_error, "timestamp": 3}
        if details is not None:
            message["details"] = details
        return self.add({"message": message})

    def text(self) -> str:
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in self.lines)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "toolCall", "id": call_id, "name": name, "arguments": arguments}


# Every tool call of the hostile transcript, by id: the page must show each one.
HOSTILE_CALL_IDS = ["call_bash_1", "call_read_1", "call_edit_1", "call_edit_legacy", "call_write_1",
                    'call_"><script>x</script>', "call_grep_1", "call_bash_err", "call_after_compaction"]


def hostile_session() -> str:
    s = SessionBuilder()
    s.add({"type": "model_change", "provider": "openai", "modelId": "scripted"})
    s.add({"type": "thinking_level_change", "thinkingLevel": "high"})
    s.user(f"Fix hello.py {HOSTILE}")
    s.assistant({"type": "thinking", "thinking": f"I should look first {HOSTILE}"},
                {"type": "text", "text": f"Looking around {HOSTILE}"},
                call("call_bash_1", "bash", command=f"ls && echo '{SCRIPT}'"),
                call("call_read_1", "read", path="hello.py", offset=1, limit=20))
    s.result("call_bash_1", "bash", f"hello.py\nREADME.md\n{HOSTILE}\n")
    s.result("call_read_1", "read", 'print("hello")\n')
    s.assistant(call("call_edit_1", "edit", path="hello.py",
                     edits=[{"oldText": 'print("hello")', "newText": 'print("hello, pid")'}]),
                call("call_edit_legacy", "edit", path=f"x{HOSTILE}.py", oldText="a = 1\nb = 2\n",
                     newText=f"a = 1\nb = 3  # {HOSTILE}\n"),
                call("call_write_1", "write", path="notes/new.txt", content=f"made by the agent\n{HOSTILE}\n"))
    s.result("call_edit_1", "edit", "Successfully replaced 1 block(s) in hello.py.",
             details={"diff": '-1 print("hello")\n+1 print("hello, pid")', "patch": EDIT_PATCH})
    s.result("call_edit_legacy", "edit", "Successfully replaced 1 block(s).")
    s.result("call_write_1", "write", "Successfully wrote 18 bytes to notes/new.txt")
    abandoned = s.last
    s.assistant(call('call_"><script>x</script>', f"tool{HOSTILE}", **{f"k{HOSTILE}": HOSTILE}),
                call("call_grep_1", "grep", pattern=f"x{HOSTILE}", glob="*.py"))
    s.result('call_"><script>x</script>', "weird", HOSTILE, is_error=True)
    s.result("call_grep_1", "grep", "No matches")
    s.add({"type": "compaction", "summary": f"## Goal\nFix hello.py {HOSTILE}", "firstKeptEntryId": "e0000003",
           "tokensBefore": 12345, "details": {"readFiles": ["README.md"], "modifiedFiles": [f"hello.py{HOSTILE}"]},
           "fromHook": False})
    s.assistant(call("call_bash_err", "bash", command="python3 hello.py\nexit 3"),
                call("call_after_compaction", "bash", command="git diff"))
    s.result("call_bash_err", "bash", "hello, pid\n\nCommand exited with code 3", is_error=True)
    s.result("call_after_compaction", "bash", PATCH)
    s.assistant({"type": "text", "text": f"Done {HOSTILE}"}, stop="stop")
    tip = s.last
    # A branch left behind (pi's /tree): not on the current path, not shown.
    s.add({"message": {"role": "user", "content": [{"type": "text", "text": "BRANCH-NOT-SHOWN"}]}},
          parent=abandoned)
    s.add({"type": "label", "targetId": tip, "label": "x"}, parent=tip)   # the leaf: the last entry of the file
    return s.text() + '{"type":"message","id":"torn","parentId":'   # a torn last line (a crash mid-write)


def hostile_result(job_id: str = "job-hostile") -> dict[str, Any]:
    return {"id": job_id, "status": "failed", "exit_reason": "check_failed", "final_message": f"Done {HOSTILE}",
            "turns": 5, "tool_calls": len(HOSTILE_CALL_IDS),
            "usage": {"input": 500, "output": 100, "cache_read": 0, "cache_write": 0, "total_tokens": 600,
                      "cost": 0.005},
            "model": "scripted", "image": "pid-sandbox:latest", "task": f"Fix hello.py {HOSTILE}",
            "repo": "/tmp/repo", "started_at": "2026-11-30T10:00:00.000Z", "finished_at": "2026-11-30T10:00:07.000Z",
            "duration_s": 7.25, "error": f"check failed {HOSTILE}",
            "check": {"command": f"python3 -m unittest {HOSTILE}", "exit_code": 1, "passed": False,
                      "duration_s": 1.5, "output_tail": f"FAILED (failures=1)\nCHECK-TAIL-MARK {HOSTILE}",
                      "timed_out": False}}


def write_job(job_dir: Path, result: dict[str, Any] | None = None, session: str | None = None,
              patch: str | None = PATCH) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    if result is not None:
        (job_dir / "result.json").write_text(json.dumps(result, indent=2))
    if session is not None:
        (job_dir / "session.jsonl").write_text(session)
    if patch is not None:
        (job_dir / "patch.diff").write_text(patch)
    return job_dir


def simple_session(call_ids: list[str]) -> str:
    s = SessionBuilder()
    s.user("Make the tests pass.")
    for call_id in call_ids:
        s.assistant(call(call_id, "bash", command=f"echo {call_id}"))
        s.result(call_id, "bash", f"{call_id}\n")
    s.assistant({"type": "text", "text": "Done."}, stop="stop")
    return s.text()


# Batch items as `pid batch` writes them to batch.jsonl: (id, status, check passed, cost, turns, duration).
BATCH_ITEMS = [("proj-a-1", "completed", True, 0.012, 3, 12.5), ("proj-b-2", "failed", False, 0.034, 7, 40.0),
               ("proj-c-3", "limit", None, 0.002, 20, 5.25), ("<b>x</b>", "completed", True, 0.5, 1, 99.0)]


def write_batch(batch_dir: Path) -> Path:
    """A batch directory: items with artifacts (the odd id too), one without a folder (never ran), a line with
    fields missing, a line that is not JSON, and an earlier line of an id that a resume replaced."""
    batch_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = [json.dumps({"id": "proj-a-1", "status": "running"})]   # replaced by the later line
    for n, (item_id, status, passed, cost, turns, duration) in enumerate(BATCH_ITEMS):
        check = None if passed is None else {"command": "python3 -m unittest", "exit_code": 0 if passed else 1,
                                             "passed": passed, "duration_s": 0.5, "output_tail": "OK",
                                             "timed_out": False}
        line = {"id": item_id, "job_id": f"job-{n}", "status": status, "exit_reason": "stop", "exit_code": 0,
                "cost": cost, "tokens": 1000 * (n + 1), "turns": turns, "duration_s": duration, "check": check}
        lines.append(json.dumps(line))
        folder = batch_dir / ("odd-item" if item_id.startswith("<") else item_id)
        result = {"id": f"job-{n}", "status": status, "exit_reason": "stop", "turns": turns, "duration_s": duration,
                  "task": f"Task {item_id} {HOSTILE}", "usage": {"total_tokens": 1000 * (n + 1), "cost": cost}}
        if check:
            result["check"] = check
        if item_id.startswith("<"):
            folder = batch_dir / f"job-{n}"   # found by its job id when the item id is no file name
        write_job(folder, result, simple_session([f"call_{n}_a", f"call_{n}_b"]))
    lines.append(json.dumps({"id": "never-ran"}))
    lines.append("{not json")
    (batch_dir / "batch.jsonl").write_text("\n".join(lines) + "\n")
    (batch_dir / "summary.json").write_text(json.dumps({"counts": {"completed": 2, "failed": 1, "limit": 1},
                                                        "cost": {"total": 0.548, "p50": 0.02},
                                                        "note": HOSTILE}))
    return batch_dir
