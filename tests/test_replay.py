"""pid.replay keeps what the model is sent up to date by appending: it must equal the conversation replayed whole,
whatever happened to it between two calls."""
from __future__ import annotations

from pid.messages import AssistantMessage, Message, TextContent, ToolCall, ToolResultMessage, UserMessage
from pid.replay import MISSING_RESULT_ERROR, Replay


def replayed_whole(messages: list[Message], opening: Message | None = None, first_kept: int = 0) -> list[tuple]:
    """The definition: failed or aborted replies left out, a stand-in result after each call nothing answers."""
    visible = messages[first_kept:]
    answered = {m.tool_call_id for m in visible if isinstance(m, ToolResultMessage)}
    out: list[tuple] = [("opening", id(opening))] if opening is not None else []
    for m in visible:
        if isinstance(m, AssistantMessage):
            if m.stop_reason in ("error", "aborted"):
                continue
            out.append(("message", id(m)))
            out += [("stand-in", c.id) for c in m.tool_calls if c.id not in answered]
        else:
            out.append(("message", id(m)))
    return out


def shape(replayed: list[Message], messages: list[Message], opening: Message | None) -> list[tuple]:
    ours = {id(m) for m in messages} | {id(opening)}
    out = []
    for m in replayed:
        if id(m) in ours:
            out.append(("opening" if m is opening else "message", id(m)))
        else:
            assert isinstance(m, ToolResultMessage) and m.is_error and m.text == MISSING_RESULT_ERROR
            out.append(("stand-in", m.tool_call_id))
    return out


def call(i: int) -> AssistantMessage:
    return AssistantMessage([ToolCall(f"c{i}", "bash", {"command": "ls"})], stop_reason="toolUse")


def result(i: int) -> ToolResultMessage:
    return ToolResultMessage(f"c{i}", "bash", [TextContent("ok")])


def test_a_growing_conversation_is_replayed_as_a_whole_replay_would_be() -> None:
    replay = Replay()
    messages: list[Message] = [UserMessage.text("task")]
    summary = UserMessage.text("summary")
    # appended in turns; a failed reply, an unanswered call answered later, a steer, a compaction, a replacement
    steps: list[tuple[list[Message], Message | None, int]] = []
    for i in range(6):
        messages += [call(i), result(i)]
        steps.append((list(messages), None, 0))
    messages += [AssistantMessage([TextContent("half")], stop_reason="error"), call(6)]
    steps.append((list(messages), None, 0))   # c6 has no result yet: a stand-in
    messages += [result(6), UserMessage.text("steer")]
    steps.append((list(messages), None, 0))   # ... and now it has its own
    messages += [call(7), AssistantMessage([ToolCall("c8", "bash", {})], stop_reason="aborted"), result(7)]
    steps.append((list(messages), None, 0))
    steps.append((list(messages), summary, 5))   # compacted
    messages += [call(9), result(9)]
    steps.append((list(messages), summary, 5))
    steps.append((list(messages), summary, 7))   # compacted again
    steps.append((messages[:4], None, 0))   # a new, shorter list
    steps.append(([UserMessage.text("other"), call(1)], None, 0))
    for msgs, opening, first_kept in steps:
        got = replay.messages(list(msgs), opening, first_kept)
        assert shape(got, msgs, opening) == replayed_whole(msgs, opening, first_kept), (len(msgs), first_kept)


def test_the_same_objects_are_handed_out_each_call_and_the_list_is_new() -> None:
    replay = Replay()
    messages: list[Message] = [UserMessage.text("task"), call(1)]
    first = replay.messages(messages)
    messages.append(UserMessage.text("more"))
    second = replay.messages(messages)
    assert second[:3] == first and all(a is b for a, b in zip(first, second))   # the stand-in too
    assert second is not replay.messages(messages)
