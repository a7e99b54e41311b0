"""OpenAI-compatible Chat Completions over SSE.

One lenient client for OpenAI, vLLM, Ollama, llama.cpp server and OpenRouter: tool-call fragments are assembled by
index (or by id when a server leaves the index out), usage is taken from whichever chunk carries it, reasoning deltas
become thinking, unknown fields are ignored. Failures come back as an AssistantMessage with stop_reason "error".

Images: user messages carry them as `image_url` data URLs. A `tool` message may only hold text, so a tool result's
images follow the run of tool messages as one extra user message ("Images returned by tool calls: ...").
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from pid.config import API_NAMES, base_url_for
from pid.messages import (AssistantMessage, Content, StopReason, ImageContent, Message, TextContent, ThinkingContent,
                          ToolCall, ToolResultMessage, ToolSpec, Usage, UserMessage)
from pid.providers import retry
from pid.providers.base import IdentityCache, ProviderConfig, StreamListener, price, token_count
from pid.providers.transport import (BLOCK_BYTES, NO_ANSWER, Pieces, StreamReply, StreamingProvider, ToolsJSON,
                                     json_object, truncate, utf8_size, whole_number)

API = API_NAMES["openai"]
DEFAULT_MAX_OUTPUT = 32000   # pi's cap on a model's maxTokens when the request names none
OPENAI_HOST = "api.openai.com"

# Where OpenAI-compatible servers put the reasoning text (vLLM, llama.cpp, DeepSeek, OpenRouter ...): the first
# non-empty one counts. The field's name is kept as the thinking block's signature, and the reasoning goes back in
# that field of the assistant message on the next request (llama.cpp and gpt-oss need it), as pi does.
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_text")

_FINISH: dict[str, StopReason] = {"stop": "stop", "length": "length", "tool_calls": "toolUse",
                                  "function_call": "toolUse"}


class OpenAIProvider(StreamingProvider):
    label = "openai"
    api = API

    def __init__(self, config: ProviderConfig) -> None:
        auth = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        super().__init__(config, base_url_for(API, config.base_url).rstrip("/") + "/chat/completions", auth)
        self._tools = ToolsJSON(_tool_entry)
        self._same_model = lambda m: m.api == API and m.model == config.model
        self._conversation = _ConversationJSON(self._same_model)
        # OpenAI's own endpoint refuses `max_tokens` for its reasoning models (o1, o3, o4-mini, gpt-5...) and takes
        # `max_completion_tokens` for every model; other servers (vLLM, llama.cpp, Ollama...) know `max_tokens`.
        self._max_tokens_field = "max_completion_tokens" if httpx.URL(self._url).host == OPENAI_HOST else "max_tokens"

    def _new_reply(self) -> "_Reply":
        return _Reply()

    def request_body(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        return self._body(to_openai_messages(system, messages, self._same_model),
                          [_tool_entry(t) for t in tools] if tools else None)

    def request_bytes(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> bytes:
        """request_body's JSON, byte for byte, without converting and encoding the whole conversation (and the tools)
        again every turn: what the previous request sent is kept, and only what was added is encoded."""
        raw = {"messages": self._conversation.json(system, messages)}
        if tools:
            raw["tools"] = self._tools.json(tools)
        return json_object(self._body(None, True if tools else None), raw).encode()

    def _body(self, messages: Any, tools: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages,
                                "stream": True, "stream_options": {"include_usage": True}}
        if tools is not None:   # (tool_choice said: llama-cpp-python's function-calling drops tools without it)
            body["tools"] = tools
            body["tool_choice"] = "auto"
        # As pi sends it: what the job asks, else the model's own ceiling (at most 32000) where the table knows it. A
        # local server without it generates until its context is full.
        limit = self.config.max_tokens or min(self.config.model_max_tokens or 0, DEFAULT_MAX_OUTPUT)
        if limit:
            body[self._max_tokens_field] = limit
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.thinking != "off":
            body["reasoning_effort"] = self.config.thinking
        return body

    def _message(self, reply: "_Reply") -> AssistantMessage:
        content, stop_reason, error = reply.result()
        return AssistantMessage(content, API, self.config.provider, self.config.model,
                                price(self._usage(reply), self.config), stop_reason, error, reply.response_id)

    def _usage(self, reply: "_Reply") -> Usage:
        return reply.usage()


@dataclass
class _CallParts:
    id: str | None = None
    name: str = ""
    arguments: Pieces = field(default_factory=Pieces)


class _Reply(StreamReply):
    """The assistant message as it streams in."""

    def __init__(self) -> None:
        super().__init__()
        # ("text" | "thinking", pieces, the reasoning field) in arrival order
        self.blocks: list[tuple[str, Pieces, str | None]] = []
        self.calls: dict[Any, _CallParts] = {}
        self.finish: str | None = None
        self.raw_usage: dict[str, Any] | None = None

    def feed(self, _event: str, chunk: dict[str, Any], on_text: StreamListener | None) -> None:
        if self.response_id is None and chunk.get("id"):
            self.response_id = str(chunk["id"])
        if chunk.get("error"):
            self.fail("the server reported an error mid-stream: " + truncate(_error_message(chunk["error"])),
                      retry=_stream_error_retry(chunk["error"]))
            return
        usage = chunk.get("usage")
        if usage and isinstance(usage, dict):   # (anything else is no usage: the tokens are estimated)
            self.raw_usage = usage
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0] if isinstance(choices, list) else None
        if not isinstance(choice, dict):
            return self._malformed(chunk)
        delta = choice.get("delta")
        if delta:
            text = delta.get("content") if isinstance(delta, dict) else None
            if not isinstance(delta, dict) or not (text is None or isinstance(text, (str, list))):
                return self._malformed(chunk)
            if text:
                if isinstance(text, list):  # a few servers stream content parts
                    text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
                if text:
                    self._append("text", text)
                    if on_text is not None:
                        on_text(text)
            for name in REASONING_FIELDS:
                thinking = delta.get(name)
                if thinking and isinstance(thinking, str):
                    self._append("thinking", thinking, name)
                    break
            for fragment in delta.get("tool_calls") or ():
                if not self._call_fragment(fragment):
                    return
            # The legacy single-function shape, read only where it comes alone: llama-cpp-python repeats every
            # fragment of `tool_calls` in `function_call` within the same delta (appending both doubled them).
            if delta.get("function_call") and not delta.get("tool_calls"):
                self._call_fragment({"index": 0, "function": delta["function_call"]})
        elif not (delta is None or isinstance(delta, dict)):   # ("", 0 or [] too)
            return self._malformed(chunk)
        if choice.get("finish_reason"):   # (a string; anything else is read as the end it still marks)
            finish = choice["finish_reason"]
            self.finish = finish if isinstance(finish, str) else "stop"

    def _malformed(self, chunk: dict[str, Any]) -> None:
        self.fail("malformed stream data from the server (not the shape of a chat completion chunk): "
                  + truncate(json.dumps(chunk)))

    def _append(self, kind: str, piece: str, source: str | None = None) -> None:
        self.grow(utf8_size(piece))
        if self.blocks and self.blocks[-1][0] == kind:
            self.blocks[-1][1].append(piece)
        else:
            self.grow(BLOCK_BYTES)
            self.blocks.append((kind, Pieces(piece), source))

    @property
    def finished(self) -> bool:
        return self.finish is not None or self.done

    def _call_fragment(self, fragment: Any) -> bool:
        """A piece of a tool call into its slot; False when it is not shaped as one (the reply fails, saying so)."""
        key = fragment.get("index") if isinstance(fragment, dict) else None
        function = (fragment.get("function") or {}) if isinstance(fragment, dict) else None
        if not isinstance(function, dict) or (key is not None and whole_number(key) is None):
            self.fail("malformed stream data from the server (not the shape of a tool call): "
                      + truncate(json.dumps(fragment)))
            return False
        call_id = fragment.get("id")
        if key is None:  # no index: a new id starts the next call, anything else continues the last one
            last = list(self.calls.values())[-1] if self.calls else None
            continues = last is not None and (not call_id or call_id == last.id)
            key = list(self.calls)[-1] if continues else ("next", len(self.calls))
        slot = self.calls.get(key)
        if slot is not None and call_id and slot.id and call_id != slot.id:
            key, slot = ("next", len(self.calls)), None  # a server reusing one index for parallel calls
        if slot is None:
            self.grow(BLOCK_BYTES)
            slot = self.calls[key] = _CallParts()
        if call_id and not slot.id:
            slot.id = str(call_id)
            self.grow(utf8_size(slot.id))
        if function.get("name") and not slot.name:
            slot.name = str(function["name"])
            self.grow(utf8_size(slot.name))
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # already parsed by a lenient server
            arguments = json.dumps(arguments)
        if arguments and isinstance(arguments, str):
            self.grow(utf8_size(arguments))
            slot.arguments.append(arguments)
        return True

    def usage(self) -> Usage:
        raw = self.raw_usage or {}
        prompt = token_count(raw.get("prompt_tokens"))
        details = raw.get("prompt_tokens_details") or {}
        cached = token_count(details.get("cached_tokens") if isinstance(details, dict) else 0) \
            or token_count(raw.get("prompt_cache_hit_tokens"))
        completion = raw.get("completion_tokens_details") or {}
        reasoning = token_count(completion.get("reasoning_tokens") if isinstance(completion, dict) else 0)
        # completion_tokens already holds the reasoning tokens (OpenAI's definition; pi adds them once more)
        return Usage(input=max(prompt - cached, 0), output=token_count(raw.get("completion_tokens")), cache_read=cached,
                     reasoning=reasoning)

    def result(self) -> tuple[list[Content], StopReason, str | None]:
        content: list[Content] = []
        for kind, pieces, source in self.blocks:
            text = pieces.text()
            content.append(TextContent(text) if kind == "text" else ThinkingContent(text, source))
        for slot in self.calls.values():
            arguments, raw = parse_arguments(slot.arguments.text())
            content.append(ToolCall(slot.id or f"call_{uuid.uuid4().hex[:24]}", slot.name, arguments, raw))
        if self.error is not None:
            return content, ("aborted" if self.aborted else "error"), self.error
        if not content and self.finish is None:   # (a bare "[DONE]": not even an empty answer)
            return content, "error", NO_ANSWER
        if self.finish == "length":  # tool calls cut by the token limit must not run: the loop fails them
            return content, "length", None
        if self.calls:
            return content, "toolUse", None
        if self.finish == "content_filter":
            return content, "error", "the provider's content filter stopped the response"
        return content, _FINISH.get(self.finish or "stop", "stop"), None


def parse_arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """(arguments, None) when `text` is a JSON object; ({}, text) otherwise so the loop can show the model. Raw
    control characters inside strings are taken (a newline typed into a command: llama-cpp-python passes the
    model's own through)."""
    if not text.strip():
        return {}, None
    try:
        value = json.loads(text, strict=False)
        if isinstance(value, str):  # double-encoded by some models
            value = json.loads(value, strict=False)
    except (ValueError, RecursionError):   # (arguments nested a thousand deep: as malformed as any)
        return {}, text
    return (value, None) if isinstance(value, dict) else ({}, text)


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error))
    return str(error)


def _stream_error_retry(error: Any) -> str | None:
    """Whether an error chunk inside a stream is the server's trouble (worth a retry) rather than the request's."""
    if not isinstance(error, dict):
        error = {"message": str(error)}
    code = error.get("code")
    status = code if isinstance(code, int) else int(code) if isinstance(code, str) and code.isdigit() else None
    if status is not None and retry.reason_for_status(status):
        return retry.reason_for_status(status)
    words = " ".join(str(error.get(k) or "") for k in ("type", "code", "message")).lower()
    if "overloaded" in words:
        return retry.OVERLOADED
    if "rate limit" in words or "rate_limit" in words:
        return retry.RATE_LIMITED
    if "server_error" in words or "server error" in words:
        return retry.SERVER_ERROR
    return None


def _data_url(image: ImageContent) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}}


def _user_content(blocks: list[TextContent | ImageContent]) -> str | list[dict[str, Any]]:
    if all(isinstance(b, TextContent) for b in blocks):
        return "".join(b.text for b in blocks)  # type: ignore[union-attr]
    return [{"type": "text", "text": b.text} if isinstance(b, TextContent) else _data_url(b) for b in blocks]


def to_openai_messages(system: str, messages: list[Message],
                       same_model: Callable[[AssistantMessage], bool] = lambda _m: False) -> list[dict[str, Any]]:
    """The conversation in Chat Completions form (what a request sends is built faster, to the same bytes, by
    _ConversationJSON). `same_model` tells whether an assistant message came from the model being asked (only its
    reasoning goes back in the reasoning field; another model's becomes text, as pi does)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    images: list[ImageContent] = []  # from the current run of tool results

    def flush_images() -> None:
        if images:
            out.append(_images_entry(images))
            images.clear()

    for message in messages:
        entry, attached = _entry(message, same_model)
        if not isinstance(message, ToolResultMessage):
            flush_images()
        if entry is not None:   # None: nothing the model could use; some servers reject an empty assistant turn
            out.append(entry)
        images.extend(attached)
    flush_images()
    return out


def _images_entry(images: list[ImageContent]) -> dict[str, Any]:
    """The user message that carries a run of tool results' images (a `tool` message holds only text)."""
    return {"role": "user", "content": [{"type": "text", "text": "Images returned by tool calls:"}]
            + [_data_url(i) for i in images]}


def _tool_entry(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


class _ConversationJSON:
    """to_openai_messages' list as json.dumps writes it, kept from one request to the next: when a request's messages
    extend the previous request's (an agent's turn appends), only the new ones are converted and encoded, each once."""

    def __init__(self, same_model: Callable[[AssistantMessage], bool]) -> None:
        self._same_model = same_model
        self._encoded = IdentityCache()
        self._system: str | None = None
        self._messages: list[Message] = []   # what the kept parts encode
        self._parts: list[str] = []          # one JSON text per entry so far
        self._images: list[ImageContent] = []  # from the trailing run of tool results: their entry is not yet made

    def json(self, system: str, messages: list[Message]) -> str:
        seen = len(self._messages)
        if system != self._system or messages[:seen] != self._messages:   # not a continuation: start again
            self._encoded.begin()
            self._system, self._messages, self._images = system, [], []
            self._parts = [json.dumps({"role": "system", "content": system})] if system else []
            seen = 0
        try:
            for message in messages[seen:]:
                text, attached = self._encoded.get(message, self._encode)
                if self._images and not isinstance(message, ToolResultMessage):
                    self._parts.append(json.dumps(_images_entry(self._images)))
                    self._images = []
                if text is not None:
                    self._parts.append(text)
                self._images += attached
        except BaseException:
            self._system = None   # half-updated: the next request starts again
            raise
        self._messages += messages[seen:]
        parts = self._parts + [json.dumps(_images_entry(self._images))] if self._images else self._parts
        return "[" + ", ".join(parts) + "]"

    def _encode(self, message: Message) -> tuple[str | None, list[ImageContent]]:
        entry, attached = _entry(message, self._same_model)
        return (json.dumps(entry) if entry is not None else None), attached


def _entry(message: Message, same_model: Callable[[AssistantMessage], bool]
           ) -> tuple[dict[str, Any] | None, list[ImageContent]]:
    """One message's entry, and the images that must follow the run of tool messages it belongs to."""
    if isinstance(message, ToolResultMessage):
        attached = [c for c in message.content if isinstance(c, ImageContent)]
        text = message.text or ("(image attached below)" if attached else "(no output)")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": text}, attached
    if isinstance(message, UserMessage):
        return {"role": "user", "content": _user_content(message.content)}, []
    return _assistant_entry(message, same_model(message)), []


def _assistant_entry(message: AssistantMessage, same_model: bool) -> dict[str, Any] | None:
    thinking = [c for c in message.content if isinstance(c, ThinkingContent) and c.thinking.strip()
                and not c.redacted]
    field_name = thinking[0].signature if thinking and same_model else None
    if field_name not in REASONING_FIELDS:
        field_name = None
    if same_model or not thinking:
        text = message.text
    else:   # another model's reasoning reaches this one as text
        text = "".join(c.text if isinstance(c, TextContent) else c.thinking for c in message.content
                       if isinstance(c, TextContent) or (isinstance(c, ThinkingContent) and c.thinking.strip()
                                                          and not c.redacted))
    calls = message.tool_calls
    if not text and not calls and not field_name:
        return None
    # An assistant message that only calls tools says `"content": ""`: OpenAI's format may leave it out, but
    # llama-cpp-python's function-calling template fails on a missing one (an empty 200 stream) and its request
    # check on a null one (HTTP 500); every server seen takes "" (tests/test_server_replays.py).
    entry: dict[str, Any] = {"role": "assistant", "content": text}
    if field_name:
        entry[field_name] = "\n".join(c.thinking for c in thinking)
    if calls:
        entry["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
    return entry
