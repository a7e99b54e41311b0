"""Messages, content blocks and usage: the data every part of pid passes around.

Field names follow pi's session format (version 3) so a transcript pid writes is one pi can open; `to_dict`
produces exactly that JSON shape and `message_from_dict` reads it back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Union

StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class TextContent:
    text: str
    type: Literal["text"] = "text"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass
class ImageContent:
    data: str  # base64
    mime_type: str
    type: Literal["image"] = "image"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "image", "data": self.data, "mimeType": self.mime_type}


@dataclass
class ThinkingContent:
    """The model's reasoning. `signature`: what the provider needs to accept it back (Anthropic's signature, the
    opaque data of redacted thinking, or the OpenAI-compatible field it came in, e.g. "reasoning_content")."""
    thinking: str
    signature: str | None = None
    redacted: bool = False
    type: Literal["thinking"] = "thinking"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "thinking", "thinking": self.thinking}
        if self.signature:
            d["thinkingSignature"] = self.signature
        if self.redacted:
            d["redacted"] = True
        return d


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # The raw argument text when it was not valid JSON; the loop reports it back to the model.
    raw_arguments: str | None = None
    type: Literal["toolCall"] = "toolCall"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "toolCall", "id": self.id, "name": self.name, "arguments": self.arguments}


Content = Union[TextContent, ImageContent, ThinkingContent, ToolCall]


@dataclass
class Cost:
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.output + self.cache_read + self.cache_write

    def to_dict(self) -> dict[str, float]:
        return {"input": self.input, "output": self.output, "cacheRead": self.cache_read,
                "cacheWrite": self.cache_write, "total": self.total}


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: Cost = field(default_factory=Cost)
    reasoning: int = 0      # of `output`, the tokens spent thinking (not in pi's session shape: result.json only)
    estimated: bool = False  # pid counted it (the server reported none): said wherever the usage is shown

    @property
    def total_tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    def add(self, other: "Usage") -> None:
        self.input += other.input
        self.output += other.output
        self.cache_read += other.cache_read
        self.cache_write += other.cache_write
        self.reasoning += other.reasoning
        self.estimated = self.estimated or other.estimated
        self.cost.input += other.cost.input
        self.cost.output += other.cost.output
        self.cost.cache_read += other.cost.cache_read
        self.cost.cache_write += other.cost.cache_write

    def to_dict(self) -> dict[str, Any]:
        """pi's session shape (camelCase)."""
        shape = {"input": self.input, "output": self.output, "cacheRead": self.cache_read,
                 "cacheWrite": self.cache_write, "totalTokens": self.total_tokens, "cost": self.cost.to_dict()}
        return {**shape, "estimated": True} if self.estimated else shape

    def to_result(self) -> dict[str, Any]:
        """result.json's shape (snake_case, cost as one number in USD)."""
        shape = {"input": self.input, "output": self.output, "cache_read": self.cache_read,
                 "cache_write": self.cache_write, "reasoning": self.reasoning, "total_tokens": self.total_tokens,
                 "cost": round(self.cost.total, 6)}
        return {**shape, "estimated": True} if self.estimated else shape


@dataclass
class UserMessage:
    content: list[Union[TextContent, ImageContent]]
    timestamp: int = field(default_factory=now_ms)
    role: Literal["user"] = "user"

    @classmethod
    def text(cls, text: str) -> "UserMessage":
        return cls([TextContent(text)])

    def to_dict(self) -> dict[str, Any]:
        return {"role": "user", "content": [c.to_dict() for c in self.content], "timestamp": self.timestamp}


@dataclass
class AssistantMessage:
    content: list[Content]
    api: str = ""
    provider: str = ""
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason = "stop"
    error_message: str | None = None
    response_id: str | None = None
    timestamp: int = field(default_factory=now_ms)
    role: Literal["assistant"] = "assistant"
    # What the call's failed attempts, retried, reported using: counted in the job's usage, never in this message's
    # own (the newest reply's usage is the context's size: compaction reads it), and not written to the session.
    retried_usage: Usage | None = field(default=None, compare=False, repr=False)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for c in self.content if isinstance(c, ToolCall)]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.content if isinstance(c, TextContent))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": "assistant", "content": [c.to_dict() for c in self.content],
                             "api": self.api, "provider": self.provider, "model": self.model,
                             "usage": self.usage.to_dict(), "stopReason": self.stop_reason}
        if self.error_message is not None:
            d["errorMessage"] = self.error_message
        d["timestamp"] = self.timestamp
        if self.response_id:
            d["responseId"] = self.response_id
        return d


@dataclass
class ToolResultMessage:
    tool_call_id: str
    tool_name: str
    content: list[Union[TextContent, ImageContent]]
    is_error: bool = False
    details: dict[str, Any] | None = None
    timestamp: int = field(default_factory=now_ms)
    role: Literal["toolResult"] = "toolResult"

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.content if isinstance(c, TextContent))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": "toolResult", "toolCallId": self.tool_call_id, "toolName": self.tool_name,
                             "content": [c.to_dict() for c in self.content]}
        if self.details is not None:
            d["details"] = self.details
        d["isError"] = self.is_error
        d["timestamp"] = self.timestamp
        return d


Message = Union[UserMessage, AssistantMessage, ToolResultMessage]


def content_from_dict(d: dict[str, Any]) -> Content:
    kind = d.get("type")
    if kind == "text":
        return TextContent(d["text"])
    if kind == "image":
        return ImageContent(d["data"], d.get("mimeType", "image/png"))
    if kind == "thinking":
        return ThinkingContent(d.get("thinking", ""), d.get("thinkingSignature"), bool(d.get("redacted")))
    if kind == "toolCall":
        return ToolCall(d["id"], d["name"], d.get("arguments") or {})
    raise ValueError(f"unknown content type {kind!r}")


def usage_from_dict(d: dict[str, Any]) -> Usage:
    c = d.get("cost") or {}
    return Usage(d.get("input", 0), d.get("output", 0), d.get("cacheRead", 0), d.get("cacheWrite", 0),
                 Cost(c.get("input", 0.0), c.get("output", 0.0), c.get("cacheRead", 0.0), c.get("cacheWrite", 0.0)),
                 estimated=bool(d.get("estimated")))


def message_from_dict(d: dict[str, Any]) -> Message:
    """Inverse of `to_dict`, for resuming from a session file."""
    role = d.get("role")
    content = [content_from_dict(c) for c in d.get("content", [])]
    ts = d.get("timestamp") or now_ms()
    if role == "user":
        return UserMessage(content, ts)  # type: ignore[arg-type]
    if role == "assistant":
        return AssistantMessage(content, d.get("api", ""), d.get("provider", ""), d.get("model", ""),
                                usage_from_dict(d.get("usage") or {}), d.get("stopReason", "stop"),
                                d.get("errorMessage"), d.get("responseId"), ts)
    if role == "toolResult":
        return ToolResultMessage(d["toolCallId"], d.get("toolName", ""), content,  # type: ignore[arg-type]
                                 bool(d.get("isError")), d.get("details"), ts)
    raise ValueError(f"unknown message role {role!r}")


@dataclass
class ToolSpec:
    """What the model is told about a tool: its name, what it does, and its JSON schema."""
    name: str
    description: str
    parameters: dict[str, Any]
