"""pid's session.jsonl follows pi's version-3 format: same entry and message shapes as a file pi itself wrote."""
from __future__ import annotations

import json
from pathlib import Path

from pid.messages import (AssistantMessage, Cost, TextContent, ToolCall, ToolResultMessage, Usage, UserMessage)
from pid.session import SessionWriter, read_session

# Written by pi itself (npm @mariozechner/pi-coding-agent 0.73.1); a copy of shared/fixtures/, so tests stand alone.
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pi-session-v3-sample.jsonl"


def shape(obj):
    """Keys, recursively, with list items merged: the structure without the values."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        merged: dict = {}
        for item in obj:
            s = shape(item)
            if isinstance(s, dict):
                merged.setdefault(item.get("type", "?") if isinstance(item, dict) else "?", s)
        return merged
    return type(obj).__name__ if not isinstance(obj, (int, float)) or isinstance(obj, bool) else "number"


def write_like_pi(path: Path) -> None:
    usage = Usage(1513, 20, 0, 0, Cost())
    with SessionWriter(str(path), cwd="/tmp/piwork") as s:
        s.model_change("fake", "fake-model")
        s.thinking_level_change("off")
        s.message(UserMessage.text("say hi"))
        s.message(AssistantMessage([ToolCall("call_1", "bash", {"command": "echo hi-from-pi-bash"}),
                                    ToolCall("call_2", "read", {"path": "README.md"})],
                                   "openai-completions", "fake", "fake-model", usage, "toolUse",
                                   response_id="chatcmpl-1"))
        s.message(ToolResultMessage("call_1", "bash", [TextContent("hi-from-pi-bash\n")]))
        s.message(ToolResultMessage("call_2", "read", [TextContent("# readme for pi\n")]))
        s.message(AssistantMessage([TextContent("pi finished.")], "openai-completions", "fake", "fake-model",
                                   usage, "stop", response_id="chatcmpl-2"))


def test_entries_have_the_shapes_pi_writes(tmp_path):
    write_like_pi(tmp_path / "s.jsonl")
    ours = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    theirs = [json.loads(line) for line in FIXTURE.read_text().splitlines()][:len(ours)]
    assert len(ours) == 8
    for mine, pis in zip(ours, theirs):
        assert shape(mine) == shape(pis), (mine, pis)
        assert list(mine) == list(pis)  # same key order, too
        if "message" in mine:
            assert list(mine["message"]) == list(pis["message"])


def test_header_ids_and_chain(tmp_path):
    write_like_pi(tmp_path / "s.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    header = lines[0]
    assert header["type"] == "session" and header["version"] == 3 and len(header["id"]) == 36
    assert lines[1]["parentId"] is None
    for prev, entry in zip(lines[1:], lines[2:]):
        assert len(entry["id"]) == 8 and int(entry["id"], 16) >= 0
        assert entry["parentId"] == prev["id"]
    assert all(e["timestamp"].endswith("Z") for e in lines)


def test_round_trip_and_torn_last_line(tmp_path):
    path = tmp_path / "s.jsonl"
    write_like_pi(path)
    with path.open("a") as f:
        f.write('{"type":"message","id":"deadbeef","parentId"')  # a crash mid-write
    header, messages = read_session(str(path))
    assert header["cwd"] == "/tmp/piwork"
    assert [m.role for m in messages] == ["user", "assistant", "toolResult", "toolResult", "assistant"]
    assert messages[1].tool_calls[1].arguments == {"path": "README.md"}
    assert messages[-1].text == "pi finished." and messages[1].usage.input == 1513


def test_pi_written_file_reads_back(tmp_path):
    header, messages = read_session(str(FIXTURE))
    assert header["version"] == 3
    assert messages[0].role == "user" and messages[1].stop_reason == "toolUse"


def test_a_lone_surrogate_is_written_as_an_escape(tmp_path):
    """A file not in UTF-8 (edit's diff keeps its bytes as surrogates) or a model's "\\ud800" made a text UTF-8 cannot
    hold: the job failed with 0 turns and its cost lost (an attack review's). The line holds it as an escape."""
    path = tmp_path / "s.jsonl"
    with SessionWriter(str(path), cwd="/w") as s:
        s.message(UserMessage.text("caf\udce9 and \ud800"))
        s.message(UserMessage.text("plain é"))
    header, messages = read_session(str(path))
    assert [m.content[0].text for m in messages] == ["caf\udce9 and \ud800", "plain é"]
    assert "plain é" in path.read_text(encoding="utf-8")   # (only the line that needs it is escaped)


def test_storable_text_keeps_stray_bytes_as_escapes_and_makes_other_lone_surrogates_u_fffd():
    """result.json and the job store take text through storable: a lone surrogate that is no stray byte (a model's
    "\\ud800") made it raise, and the job's end was recorded as a crash."""
    from pid.jobs.spec import json_text, storable
    assert storable("plain é") == "plain é"
    assert storable("caf\udce9 \udcc3\udca9") == "caf\\xe9 é"     # stray bytes: escaped, or whole UTF-8 again
    assert storable("a \ud800 b \udfff c \udc00") == "a \ufffd b \ufffd c \ufffd"
    assert json.dumps(json_text({"final_message": "x\ud83d"}), ensure_ascii=False).encode("utf-8")
