"""How big the conversation is, in tokens. Servers that stream no usage (older vLLM, some proxies) still get a
count, so result.json, the cost cap and context management never run blind."""
from __future__ import annotations

import json

from typing import Sequence

from pid.messages import AssistantMessage, Message, ToolCall, ToolSpec, Usage
from pid.tokens import TokenCounter

# Per-message framing the chat formats add around each message (role markers, separators).
MESSAGE_OVERHEAD_TOKENS = 4


def message_text(message: Message) -> str:
    parts: list[str] = []
    for c in message.content:
        if isinstance(c, ToolCall):
            parts.append(c.name + json.dumps(c.arguments, ensure_ascii=False))
        else:
            parts.append(getattr(c, "text", None) or getattr(c, "thinking", None) or "")
    return "\n".join(parts)


def count_context(counter: TokenCounter, system: str, messages: list[Message]) -> int:
    """Tokens of the prompt a model call sends: system prompt and every message."""
    total = counter.count(system) + MESSAGE_OVERHEAD_TOKENS
    for m in messages:
        total += counter.count(message_text(m)) + MESSAGE_OVERHEAD_TOKENS
    return total


def tools_text(tools: Sequence[ToolSpec]) -> str:
    """The tool schemas as a request carries them, for counting."""
    return json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters}
                       for t in tools]) if tools else ""


def estimate_usage(counter: TokenCounter, system: str, messages: list[Message], reply: AssistantMessage,
                   tools: Sequence[ToolSpec] = ()) -> Usage:
    """Usage for a reply whose server reported none: what was sent (tool schemas included) and what came back,
    marked as pid's count."""
    return Usage(input=count_context(counter, system, messages) + counter.count(tools_text(tools)),
                 output=counter.count(message_text(reply)), estimated=True)
