"""The provider seam: stream one assistant message for (system prompt, messages, tools).

Failures never raise: they come back as an AssistantMessage with stop_reason "error" and a readable
error_message, so the loop has one path for every outcome.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pid.config import DEFAULT_API
from pid.providers.retry import RetryListener
from pid.messages import (AssistantMessage, ImageContent, Message, TextContent, ToolResultMessage, ToolSpec,
                          Usage, UserMessage)


@dataclass
class ProviderConfig:
    model: str
    base_url: str | None = None              # None: the API's own endpoint (pid.config.DEFAULT_BASE_URLS)
    api_key: str | None = None
    api: str = DEFAULT_API                   # a value of pid.config.API_NAMES
    provider: str = "openai"                 # a label recorded in the session
    max_tokens: int | None = None
    temperature: float | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0            # longest silence tolerated inside a stream
    # Retries (pid/providers/retry.py): each wait at most max_retry_wait_s, one call's retrying (from its first
    # failure) at most retry_budget_s; backoff from retry_base_s when the server names no wait; max_retries None:
    # as many as the budget allows.
    max_retry_wait_s: float = 60.0
    retry_budget_s: float = 900.0
    retry_base_s: float = 1.0
    max_retries: int | None = None
    thinking: str = "off"                    # pid.config.THINKING_LEVELS
    model_max_tokens: int | None = None      # the model's output ceiling, when known: caps max_tokens + thinking
    images: bool = True                      # the model accepts image input; else images become a note
    input_cost_per_mtok: float = 0.0         # USD per million tokens, for result.json and the cost cap
    output_cost_per_mtok: float = 0.0
    cache_read_cost_per_mtok: float = 0.0
    cache_write_cost_per_mtok: float = 0.0


MAX_TOKEN_COUNT = 10**12   # more than any conversation: a count past it is taken as it, so a cost cap still stops


def token_count(value: Any) -> int:
    """A token count as the server sent it, made sane: a whole number from 0 to MAX_TOKEN_COUNT (a negative one,
    NaN, text or 10**309 would make a negative, infinite or unprintable cost and get past --max-cost)."""
    if type(value) is int:   # (the usual case, first)
        return min(max(value, 0), MAX_TOKEN_COUNT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0
    return int(min(max(value, 0), MAX_TOKEN_COUNT))


def price(usage: Usage, config: ProviderConfig) -> Usage:
    """Fill usage.cost from the configured per-million-token prices."""
    usage.cost.input = usage.input * config.input_cost_per_mtok / 1e6
    usage.cost.output = usage.output * config.output_cost_per_mtok / 1e6
    usage.cost.cache_read = usage.cache_read * config.cache_read_cost_per_mtok / 1e6
    usage.cost.cache_write = usage.cache_write * config.cache_write_cost_per_mtok / 1e6
    return usage


IMAGE_OMITTED = "[image omitted: this model cannot see images]"


def without_images(messages: list[Message]) -> list[Message]:
    """For text-only models: each image becomes a short note, so the model knows something was there."""
    def strip(content: list) -> list:
        return [TextContent(IMAGE_OMITTED) if isinstance(c, ImageContent) else c for c in content]

    out: list[Message] = []
    for m in messages:
        if isinstance(m, (UserMessage, ToolResultMessage)) and any(isinstance(c, ImageContent) for c in m.content):
            m = dataclasses.replace(m, content=strip(m.content))
        out.append(m)
    return out


StreamListener = Callable[[str], None]  # receives text deltas as they arrive, for live views


class Provider(Protocol):
    config: ProviderConfig

    def stream(self, system: str, messages: list[Message], tools: list[ToolSpec], *,
               cancel: threading.Event | None = None,
               on_text: StreamListener | None = None,
               on_retry: RetryListener | None = None) -> AssistantMessage:
        """on_retry hears of each wait before the call is repeated (False from it: the call is not repeated); text
        streamed before it is void. What its failed attempts used is the reply's retried_usage."""
        ...

    def sibling(self, config: ProviderConfig) -> "Provider":
        """A provider for another config (a summary call's) that keeps what this one learned of the endpoint."""
        ...

    def close(self) -> None:
        """Release the HTTP connections."""
        ...


class IdentityCache:
    """A value computed once per object, for objects that never change once made (a conversation's messages).

    Keyed by identity, and it keeps only what the last round used: begin() starts a round, get() carries an entry
    over from the previous one or computes it. Not thread-safe: one provider streams from one thread.
    """

    def __init__(self) -> None:
        self._previous: dict[int, tuple[Any, Any]] = {}
        self._current: dict[int, tuple[Any, Any]] = {}

    def begin(self) -> None:
        self._previous, self._current = self._current, {}

    def get(self, obj: Any, compute: Callable[[Any], Any]) -> Any:
        key = id(obj)
        hit = self._current.get(key) or self._previous.get(key)
        if hit is None or hit[0] is not obj:     # the object holds its id only while it lives: check it is the same
            hit = (obj, compute(obj))
        self._current[key] = hit
        return hit[1]
