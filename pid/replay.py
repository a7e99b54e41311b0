"""What the model is sent of the conversation: failed or aborted replies left out, every tool call answered.

Kept up to date by appending: between two model calls an agent's conversation only grows, so each call looks at the
new messages only (replaying the whole of a long conversation would make every turn cost more than the last), and
the messages it hands out are the same objects each time (the providers cache their conversions by identity).
"""
from __future__ import annotations

from pid.messages import AssistantMessage, Message, TextContent, ToolResultMessage

MISSING_RESULT_ERROR = "Tool call was interrupted before it returned a result."


class Replay:
    """The replayed conversation of one agent, and what it was built from. Not thread-safe (the loop's thread)."""

    def __init__(self) -> None:
        self._restart(None, 0)

    def _restart(self, opening: Message | None, first_kept: int) -> None:
        self._opening = opening          # a compaction's summary, sent first
        self._first_kept = first_kept    # the agent's messages before this one are summarised
        self._seen: list[Message] = []   # the agent's messages (from first_kept on) replayed so far
        self._out: list[Message] = [opening] if opening is not None else []
        self._answered: set[str] = set()
        self._stood_in: set[str] = set()  # calls given a stand-in result, as no result of theirs was seen

    def messages(self, messages: list[Message], opening: Message | None = None, first_kept: int = 0) -> list[Message]:
        """`opening`, then messages[first_kept:] as the model sees them (a new list, the same message objects)."""
        if opening is not self._opening or first_kept != self._first_kept \
                or messages[first_kept:first_kept + len(self._seen)] != self._seen:
            self._restart(opening, first_kept)   # not a continuation of what was replayed (compacted, replaced)
        new = messages[first_kept + len(self._seen):]
        answered = {m.tool_call_id for m in new if isinstance(m, ToolResultMessage)}
        if answered & self._stood_in:   # a call that got a stand-in has its own result now: replay it all again
            self._restart(opening, first_kept)
            new = messages[first_kept:]
            answered = {m.tool_call_id for m in new if isinstance(m, ToolResultMessage)}
        self._answered |= answered
        try:
            for m in new:
                if isinstance(m, AssistantMessage):
                    if m.stop_reason in ("error", "aborted"):
                        continue
                    self._out.append(m)
                    for c in m.tool_calls:
                        if c.id not in self._answered:
                            self._out.append(ToolResultMessage(c.id, c.name, [TextContent(MISSING_RESULT_ERROR)],
                                                               True))
                            self._stood_in.add(c.id)
                else:
                    self._out.append(m)
        except BaseException:
            self._restart(None, 0)   # half-updated: the next call starts again
            raise
        self._seen += new
        return list(self._out)
