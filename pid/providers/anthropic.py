"""Anthropic Messages API over SSE.

Consecutive tool results travel as one user message of `tool_result` blocks; messages of the same role are merged
because the API wants strict user/assistant alternation. The system prompt and the conversation's moving tail (the
last block of the last user message) are marked for prompt caching, as pi does: that is what makes a long agent loop
cheap. Extended thinking follows pi: a token budget per level (adaptive thinking on the 4.6 models); thinking blocks
go back unchanged with their signatures, redacted ones as `redacted_thinking`. Failures come back with stop_reason
"error".
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from pid.config import API_NAMES, base_url_for
from pid.messages import (AssistantMessage, Content, StopReason, ImageContent, Message, TextContent, ThinkingContent,
                          ToolCall, ToolResultMessage, ToolSpec, Usage, UserMessage)
from pid.providers import retry
from pid.providers.base import IdentityCache, ProviderConfig, StreamListener, price, token_count
from pid.providers.openai import parse_arguments
from pid.providers.transport import (BLOCK_BYTES, NO_ANSWER, Pieces, StreamReply, StreamingProvider, ToolsJSON,
                                     json_object, truncate, utf8_size, whole_number)
from pid.tokens import get_counter

API = API_NAMES["anthropic"]
DEFAULT_MAX_TOKENS = 8192
ANTHROPIC_VERSION = "2023-06-01"

_STOP: dict[str, StopReason] = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop",
                                "max_tokens": "length",
         "model_context_window_exceeded": "length", "tool_use": "toolUse"}
_CACHE = {"type": "ephemeral"}
# pi's thinking budgets per level, and the output it keeps beside them when the model's ceiling is tight.
THINKING_BUDGETS = {"low": 2048, "medium": 8192, "high": 16384}
MIN_OUTPUT_TOKENS = 1024
MIN_THINKING_BUDGET = 1024       # the API's own minimum
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
REDACTED_THINKING = "[Reasoning redacted]"
# Each content_block_delta type and the field that carries its piece.
_DELTA_FIELDS = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking",
                 "signature_delta": "signature"}
# Mid-stream error types that are the service's trouble, not the request's.
_STREAM_RETRY = {"overloaded_error": retry.OVERLOADED, "rate_limit_error": retry.RATE_LIMITED,
                 "api_error": retry.SERVER_ERROR, "timeout_error": retry.TIMEOUT}


def thinking_tokens(level: str, base_max_tokens: int, model_max_tokens: int | None) -> tuple[int, int]:
    """(max_tokens, thinking budget) for a level, as pi computes them: max_tokens must exceed the budget."""
    budget = THINKING_BUDGETS[level]
    max_tokens = base_max_tokens + budget
    if model_max_tokens:
        max_tokens = min(max_tokens, model_max_tokens)
    if max_tokens <= budget:
        budget = max(0, max_tokens - MIN_OUTPUT_TOKENS)
    return max_tokens, budget


def adaptive_thinking(model: str) -> bool:
    """Opus and Sonnet 4.6 decide how much to think (`thinking: {type: adaptive}` with an effort)."""
    return any(name in model for name in ("opus-4-6", "opus-4.6", "sonnet-4-6", "sonnet-4.6"))


class AnthropicProvider(StreamingProvider):
    label = "anthropic"
    api = API

    def __init__(self, config: ProviderConfig) -> None:
        base_url = base_url_for(API, config.base_url)
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if config.api_key:
            headers["x-api-key"] = config.api_key
        super().__init__(config, base_url.rstrip("/") + "/messages", headers)
        if config.thinking != "off" and not adaptive_thinking(config.model):
            self._headers["anthropic-beta"] = INTERLEAVED_THINKING_BETA
        self._same_model = lambda m: m.api == API and m.model == config.model
        self._conversation = _MessagesJSON(self._same_model)
        self._tools = ToolsJSON(_tool_entry)

    def _new_reply(self) -> "_Reply":
        return _Reply()

    def _message(self, reply: "_Reply") -> AssistantMessage:
        content, stop_reason, error = reply.result()
        thought = "".join(c.thinking for c in content if isinstance(c, ThinkingContent) and not c.redacted)
        if thought:   # the API counts thinking within output_tokens, without a figure of its own: estimated
            counted = get_counter().count(thought)
            reply.usage.reasoning = min(counted, reply.usage.output) if reply.usage.output else counted
        return AssistantMessage(content, API, self.config.provider, self.config.model,
                                price(self._usage(reply), self.config), stop_reason, error, reply.response_id)

    def _usage(self, reply: "_Reply") -> Usage:
        return reply.usage

    def request_body(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        return self._body(system, to_anthropic_messages(messages, self._same_model),
                          [_tool_entry(t) for t in tools] if tools else None)

    def request_bytes(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> bytes:
        """request_body's JSON, byte for byte, without converting and encoding the whole conversation (and the tools)
        again every turn: what the previous request sent is kept, and only what was added is encoded."""
        raw = {"messages": self._conversation.json(messages)}
        if tools:
            raw["tools"] = self._tools.json(tools)
        return json_object(self._body(system, None, True if tools else None), raw).encode()

    def _body(self, system: str, messages: Any, tools: Any) -> dict[str, Any]:
        config = self.config
        max_tokens = config.max_tokens or DEFAULT_MAX_TOKENS
        if config.model_max_tokens:
            max_tokens = min(max_tokens, config.model_max_tokens)
        thinking: dict[str, Any] | None = None
        effort: str | None = None
        if config.thinking != "off":
            if adaptive_thinking(config.model):
                thinking, effort = {"type": "adaptive"}, config.thinking
            else:
                max_tokens, budget = thinking_tokens(config.thinking, max_tokens, config.model_max_tokens)
                if budget >= MIN_THINKING_BUDGET:
                    thinking = {"type": "enabled", "budget_tokens": budget}
        body: dict[str, Any] = {"model": config.model, "max_tokens": max_tokens, "messages": messages, "stream": True}
        if system:
            body["system"] = [{"type": "text", "text": system, "cache_control": _CACHE}]
        if tools is not None:
            body["tools"] = tools
        if thinking is not None:
            body["thinking"] = thinking
            if effort:
                body["output_config"] = {"effort": effort}
        elif config.temperature is not None:   # the API refuses a temperature with thinking on
            body["temperature"] = config.temperature
        return body


def _tool_entry(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


@dataclass
class _Block:
    type: str
    parts: Pieces = field(default_factory=Pieces)
    id: str = ""
    name: str = ""
    signature: Pieces | None = None
    data: str = ""           # a redacted_thinking block's opaque payload


class _Reply(StreamReply):
    """The assistant message as its events arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[int, _Block] = {}
        self.usage = Usage()
        self.stop_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.done or self.stop_reason is not None

    def feed(self, event: str, payload: dict[str, Any], on_text: StreamListener | None) -> None:
        kind = payload.get("type") or event
        if kind == "content_block_delta":
            at = whole_number(payload.get("index", 0))
            block = self.blocks.get(at) if at is not None else None
            delta = _dict(payload.get("delta"))
            if block is None:
                return
            delta_type = delta.get("type")
            field_name = _DELTA_FIELDS.get(delta_type) if isinstance(delta_type, str) else None
            piece = delta.get(field_name) if field_name else None
            if not isinstance(piece, str) or not piece:
                return
            self.grow(utf8_size(piece))
            if delta_type == "signature_delta":
                block.signature = block.signature or Pieces()
                block.signature.append(piece)
                return
            block.parts.append(piece)
            if on_text is not None and delta_type == "text_delta":
                on_text(piece)
        elif kind == "content_block_start":
            index = whole_number(payload.get("index", len(self.blocks)))
            if index is None:
                self.fail("malformed stream data from the server: a content block's index is not a whole number: "
                          + truncate(repr(payload.get("index"))))
                return
            start = _dict(payload.get("content_block"))
            block = _Block(_str(start.get("type")), id=_str(start.get("id")), name=_str(start.get("name")),
                           data=_str(start.get("data")) if start.get("type") == "redacted_thinking" else "")
            first = ""
            if block.type in ("text", "thinking"):
                first = _str(start.get(block.type))
            elif block.type == "tool_use" and start.get("input"):  # a proxy that sends the input whole
                first = json.dumps(start["input"])
            block.parts.append(first)
            self.grow(BLOCK_BYTES + sum(utf8_size(t) for t in (block.id, block.name, block.data, first)))
            self.blocks[index] = block
        elif kind == "message_start":
            message = _dict(payload.get("message"))
            self.response_id = _str(message.get("id")) or None
            self._count(_dict(message.get("usage")))
        elif kind == "message_delta":
            self.stop_reason = _str(_dict(payload.get("delta")).get("stop_reason")) or self.stop_reason
            self._count(_dict(payload.get("usage")))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            error = payload.get("error") or {}
            label = _str(error.get("type")) or "error" if isinstance(error, dict) else "error"
            said = _str(error.get("message")) if isinstance(error, dict) else str(error)
            self.fail(f"the server reported an error mid-stream ({label}): {truncate(said)}",
                      retry=_STREAM_RETRY.get(label))   # (no HTTP status: the stream's was 200)

    def _count(self, usage: dict[str, Any]) -> None:
        """message_start carries the input side, message_delta the (cumulative) output side; later values win."""
        for key, attr in (("input_tokens", "input"), ("output_tokens", "output"),
                          ("cache_read_input_tokens", "cache_read"), ("cache_creation_input_tokens", "cache_write")):
            value = usage.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):   # (a null leaves the count)
                setattr(self.usage, attr, token_count(value))

    def result(self) -> tuple[list[Content], StopReason, str | None]:
        content: list[Content] = []
        has_calls = False
        for index in sorted(self.blocks):
            block = self.blocks[index]
            text = block.parts.text()
            if block.type == "text":
                content.append(TextContent(text))
            elif block.type == "thinking":
                content.append(ThinkingContent(text, block.signature.text() if block.signature else None))
            elif block.type == "redacted_thinking":
                content.append(ThinkingContent(REDACTED_THINKING, block.data, redacted=True))
            elif block.type == "tool_use":
                arguments, raw = parse_arguments(text)
                content.append(ToolCall(block.id, block.name, arguments, raw))
                has_calls = True
        if self.error is not None:
            return content, ("aborted" if self.aborted else "error"), self.error
        if not content and self.stop_reason is None:   # (a bare message_stop: not even an empty answer)
            return content, "error", NO_ANSWER
        if _STOP.get(self.stop_reason or "") == "length":  # truncated tool calls must not run
            return content, "length", None
        if has_calls:
            return content, "toolUse", None
        if self.stop_reason == "refusal":
            return content, "error", "the model declined to answer (stop_reason refusal)"
        return content, _STOP.get(self.stop_reason or "end_turn", "stop"), None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    """A field the format says is an object: anything else reads as an empty one."""
    return value if isinstance(value, dict) else {}


def _tool_id(call_id: str) -> str:
    """Anthropic accepts ids of [a-zA-Z0-9_-] only; ids from other providers are made to fit, consistently."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", call_id)[:64] or "tool"


def _block(c: TextContent | ImageContent) -> dict[str, Any]:
    if isinstance(c, TextContent):
        return {"type": "text", "text": c.text}
    return {"type": "image", "source": {"type": "base64", "media_type": c.mime_type, "data": c.data}}


def to_anthropic_messages(messages: list[Message],
                          same_model: Callable[[AssistantMessage], bool] = lambda m: m.api == API
                          ) -> list[dict[str, Any]]:
    """The conversation in Messages form. Thinking goes back only to the model that wrote it (its signature is
    checked): unchanged when signed, as `redacted_thinking` when redacted; unsigned or another model's thinking
    becomes text, as pi does."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in messages:
        add(*_message_blocks(message, same_model))
    if out and out[-1]["role"] == "user" and _cached(out[-1]["content"][-1]):
        out[-1]["content"][-1] = {**out[-1]["content"][-1], "cache_control": _CACHE}
    return out


def _cached(block: dict[str, Any]) -> bool:
    """Whether the conversation's last block, being this one, is marked for prompt caching."""
    return block["type"] in ("text", "image", "tool_result")


def _message_blocks(message: Message, same_model: Callable[[AssistantMessage], bool]
                    ) -> tuple[str, list[dict[str, Any]]]:
    """One message's role and content blocks (consecutive messages of a role are merged into one)."""
    if isinstance(message, UserMessage):
        return "user", [_block(c) for c in message.content if not (isinstance(c, TextContent) and not c.text)]
    if isinstance(message, ToolResultMessage):
        inner = [_block(c) for c in message.content if not (isinstance(c, TextContent) and not c.text)]
        return "user", [{"type": "tool_result", "tool_use_id": _tool_id(message.tool_call_id),
                         "content": inner or [{"type": "text", "text": "(no output)"}],
                         "is_error": message.is_error}]
    blocks: list[dict[str, Any]] = []
    own = same_model(message)
    for c in message.content:
        if isinstance(c, ThinkingContent):
            blocks += _thinking_blocks(c, own)
        elif isinstance(c, TextContent) and c.text:
            blocks.append({"type": "text", "text": c.text})
        elif isinstance(c, ToolCall):
            blocks.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": c.arguments})
    return "assistant", blocks


def _group(role: str, blocks: list[str]) -> str:
    """json.dumps({"role": role, "content": [...]}) from its blocks' JSON."""
    return '{"role": ' + json.dumps(role) + ', "content": [' + ", ".join(blocks) + "]}"


class _MessagesJSON:
    """to_anthropic_messages' list as json.dumps writes it, kept from one request to the next: when a request's
    messages extend the previous request's (an agent's turn appends), only the new ones are converted and encoded,
    each once; the moving cache mark is put on the last block as the JSON is joined."""

    def __init__(self, same_model: Callable[[AssistantMessage], bool]) -> None:
        self._same_model = same_model
        self._encoded = IdentityCache()
        self._restart()

    def _restart(self) -> None:
        self._encoded.begin()
        self._messages: list[Message] = []     # what the state below encodes
        self._closed: list[str] = []           # each finished role group's JSON
        self._role: str | None = None          # the last group, still open to the next message of its role
        self._blocks: list[str] = []           # its blocks' JSON
        self._last: dict[str, Any] = {}        # its last block

    def json(self, messages: list[Message]) -> str:
        seen = len(self._messages)
        if messages[:seen] != self._messages:   # not a continuation: start again
            self._restart()
            seen = 0
        try:
            for message in messages[seen:]:
                role, blocks, texts = self._encoded.get(message, self._encode)
                if not blocks:
                    continue
                if role != self._role:
                    if self._role is not None:
                        self._closed.append(_group(self._role, self._blocks))
                    self._role, self._blocks = role, []
                self._blocks += texts
                self._last = blocks[-1]
        except BaseException:
            self._restart()   # half-updated: the next request starts again
            raise
        self._messages += messages[seen:]
        if self._role is None:
            return "[]"
        blocks = self._blocks
        if self._role == "user" and _cached(self._last):
            blocks = blocks[:-1] + [json.dumps({**self._last, "cache_control": _CACHE})]
        return "[" + ", ".join(self._closed + [_group(self._role, blocks)]) + "]"

    def _encode(self, message: Message) -> tuple[str, list[dict[str, Any]], list[str]]:
        role, blocks = _message_blocks(message, self._same_model)
        return role, blocks, [json.dumps(b) for b in blocks]


def _thinking_blocks(c: ThinkingContent, own: bool) -> list[dict[str, Any]]:
    if c.redacted:
        return [{"type": "redacted_thinking", "data": c.signature}] if own and c.signature else []
    if not c.thinking.strip():
        return []
    if own and c.signature:
        return [{"type": "thinking", "thinking": c.thinking, "signature": c.signature}]
    return [{"type": "text", "text": c.thinking}]
