"""The providers against a real HTTP server (tests/scripted_llm.py) speaking the OpenAI and Anthropic wire formats."""
from __future__ import annotations

import dataclasses
import functools
import json
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from pid.messages import (AssistantMessage, ImageContent, TextContent, ThinkingContent, ToolCall, ToolResultMessage,
                          ToolSpec, UserMessage)
from pid.providers import AnthropicProvider, OpenAIProvider, ProviderConfig, make_provider
from pid.providers.transport import ERROR_TEXT_LIMIT, MAX_EVENT_BYTES, MAX_REPLY_BYTES
from tests.scripted_llm import ENDLESS_CAP, ENDLESS_PIECE, ScriptedLLM

OPENAI = "openai-completions"
ANTHROPIC = "anthropic-messages"
BOTH = [OPENAI, ANTHROPIC]
BASH = ToolSpec("bash", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}},
                                           "required": ["command"]})
HELLO = [UserMessage.text("hello")]


FAST_RETRIES = {"retry_base_s": 0.01, "max_retry_wait_s": 0.2}


def provider(llm: ScriptedLLM, api: str = OPENAI, **overrides: Any) -> OpenAIProvider | AnthropicProvider:
    """No retries unless a test asks for them (then with short waits): most tests look at one failure."""
    settings = {"max_retries": 0, **FAST_RETRIES, **overrides}
    return make_provider(ProviderConfig(model="test-model", base_url=llm.base_url, api=api,  # type: ignore
                                        provider="scripted", **settings))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- both wire formats ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", BOTH)
def test_text_streams_in_pieces_and_is_assembled(api: str) -> None:
    text = "I'll look at the repository layout first, then read the tests."
    deltas: list[str] = []
    with ScriptedLLM([{"text": text}]) as llm:
        reply = provider(llm, api).stream("You are terse.", HELLO, [BASH], on_text=deltas.append)
    assert (reply.stop_reason, reply.error_message) == ("stop", None)
    assert reply.text == text and len(reply.content) == 1
    assert len(deltas) > 1 and "".join(deltas) == text
    assert (reply.api, reply.provider, reply.model) == (api, "scripted", "test-model")
    assert reply.response_id and reply.response_id.startswith(("chatcmpl-", "msg_"))


@pytest.mark.parametrize("api", BOTH)
def test_parallel_tool_calls_are_assembled_from_split_fragments(api: str) -> None:
    calls = [{"name": "bash", "arguments": {"command": "ls -la && cat \"README.md\"", "timeout": 30}},
             {"name": "read", "arguments": {"path": "src/ünïcode.py", "offset": 10}},
             {"name": "write", "arguments": {"path": "a.txt", "content": "line1\nline2\n" * 20}}]
    with ScriptedLLM([{"text": "Looking.", "tool_calls": calls, "interleave": True}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [BASH])
    assert reply.stop_reason == "toolUse"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    assert all(c.raw_arguments is None for c in reply.tool_calls)
    assert len({c.id for c in reply.tool_calls}) == 3 and all(c.id for c in reply.tool_calls)
    assert reply.text == "Looking."


@pytest.mark.parametrize("api", BOTH)
def test_invalid_argument_json_is_kept_raw(api: str) -> None:
    with ScriptedLLM([{"tool_calls": [{"name": "bash", "raw_arguments": '{"command": "ls", oops'},
                                      {"name": "bash", "arguments": {"command": "pwd"}}]}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [BASH])
    bad, good = reply.tool_calls
    assert (bad.arguments, bad.raw_arguments) == ({}, '{"command": "ls", oops')
    assert (good.arguments, good.raw_arguments) == ({"command": "pwd"}, None)
    assert reply.stop_reason == "toolUse"


@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("finish, expected", [("stop", "stop"), ("length", "length"), ("content_filter", "error")])
def test_finish_reasons_are_mapped(api: str, finish: str, expected: str) -> None:
    with ScriptedLLM([{"text": "partial answer", "finish_reason": finish}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [])
    assert reply.stop_reason == expected
    assert reply.text == "partial answer"
    assert (reply.error_message is not None) == (expected == "error")


@pytest.mark.parametrize("api", BOTH)
def test_tool_calls_mean_tool_use_whatever_the_finish_reason(api: str) -> None:
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "finish_reason": "stop"}]
    with ScriptedLLM(script) as llm:
        assert provider(llm, api).stream("", HELLO, [BASH]).stop_reason == "toolUse"


@pytest.mark.parametrize("api", BOTH)
def test_usage_and_cost(api: str) -> None:
    prices = dict(input_cost_per_mtok=3.0, output_cost_per_mtok=15.0, cache_read_cost_per_mtok=0.3)
    with ScriptedLLM([{"text": "ok", "usage": {"prompt_tokens": 1000, "completion_tokens": 200,
                                               "cached_tokens": 400}}]) as llm:
        usage = provider(llm, api, **prices).stream("", HELLO, []).usage
    assert (usage.input, usage.output, usage.cache_read) == (600, 200, 400)
    assert usage.cost.input == pytest.approx(600 * 3.0 / 1e6)
    assert usage.cost.output == pytest.approx(200 * 15.0 / 1e6)
    assert usage.cost.cache_read == pytest.approx(400 * 0.3 / 1e6)


@pytest.mark.parametrize("api", BOTH)
def test_server_error_is_retried_then_succeeds(api: str) -> None:
    with ScriptedLLM([{"error": {"status": 500}}, {"error": {"status": 503}}, {"text": "recovered"}]) as llm:
        reply = provider(llm, api, max_retries=2).stream("", HELLO, [])
        assert (reply.stop_reason, reply.text) == ("stop", "recovered")
        assert len(llm.requests) == 3 and llm.requests[0] == llm.requests[2]


@pytest.mark.parametrize("api", BOTH)
def test_a_cookie_the_server_sets_goes_back_with_the_next_request(api: str) -> None:
    """As httpx keeps them (a load balancer's sticky session): the client skips the cookie jar only for responses
    that set no cookie."""
    turns = [{"text": "one"}, {"error": {"status": 503, "headers": {"Set-Cookie": "sticky=b1; Path=/"}}},
             {"text": "two"}, {"text": "three"}]
    with ScriptedLLM(turns) as llm:
        p = provider(llm, api, max_retries=1)
        assert p.stream("", HELLO, []).text == "one"
        assert p.stream("", HELLO, []).text == "two"
        assert p.stream("", HELLO, []).text == "three"
        cookies = [h.get("cookie") for h in llm.request_headers]
    assert cookies == [None, None, "sticky=b1", "sticky=b1"]


def test_the_clients_requests_are_the_ones_httpx_builds() -> None:
    """The provider's client parses its URL and merges its headers once; what it builds must not differ."""
    import httpx

    from pid.providers.transport import make_client

    url = "http://127.0.0.1:9/v1/chat/completions"
    ours = make_client(ProviderConfig(model="m"), url)
    for headers in ({"Content-Type": "application/json", "Accept": "text/event-stream"},
                    {"Content-Type": "application/json", "x-api-key": "k"}, {"Content-Type": "application/json"}):
        for body in (b"{}", b'{"a": 1}'):
            built = ours.build_request("POST", url, headers=headers, content=body)
            plain = httpx.Client.build_request(ours, "POST", url, headers=headers, content=body)
            assert (built.method, built.url, built.headers.raw, built.extensions, built.content) == \
                (plain.method, plain.url, plain.headers.raw, plain.extensions, plain.content)
    ours.close()


@pytest.mark.parametrize("api", BOTH)
def test_retries_are_bounded_and_the_last_error_is_reported(api: str) -> None:
    with ScriptedLLM([{"error": {"status": 502, "message": "upstream melted"}}] * 5) as llm:
        reply = provider(llm, api, max_retries=1).stream("", HELLO, [])
        assert len(llm.requests) == 2
    assert reply.stop_reason == "error"
    assert "502" in reply.error_message and "upstream melted" in reply.error_message
    assert "after 2 attempts" in reply.error_message


@pytest.mark.parametrize("api", BOTH)
def test_client_error_is_reported_with_the_servers_words_and_not_retried(api: str) -> None:
    body = {"error": {"message": "This model's maximum context length is 8192 tokens. " + "x" * 2000,
                      "type": "invalid_request_error"}}
    with ScriptedLLM([{"error": {"status": 400, "body": body}}, {"text": "must not be reached"}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [])
        assert llm.remaining == 1 and len(llm.requests) == 1
    assert reply.stop_reason == "error" and reply.content == []
    assert "HTTP 400" in reply.error_message and "maximum context length is 8192" in reply.error_message
    assert len(reply.error_message) < 700


def test_plain_text_error_body_is_reported() -> None:
    with ScriptedLLM([{"error": {"status": 404, "body": "model 'gpt-9' not found"}}]) as llm:
        reply = provider(llm).stream("", HELLO, [])
    assert "HTTP 404" in reply.error_message and "model 'gpt-9' not found" in reply.error_message


def test_retry_after_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait is the one the server asked for; it is recorded, not slept (the wait itself: tests/test_retries.py)."""
    from pid.providers import retry
    waits: list[float] = []
    monkeypatch.setattr(retry, "interruptible_wait", lambda seconds, cancel: waits.append(seconds) or False)
    with ScriptedLLM([{"error": {"status": 429, "headers": {"Retry-After": "1"}}}, {"text": "ok"}]) as llm:
        reply = provider(llm, max_retries=None, max_retry_wait_s=60).stream("", HELLO, [])
    assert reply.text == "ok"
    assert waits == [1.0]


def test_a_wait_asked_past_the_retry_budget_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI user's: a 429 asking for 30 s under --retry-budget 10 failed at once, with only the server's words."""
    from pid.providers import retry
    waits: list[float] = []
    monkeypatch.setattr(retry, "interruptible_wait", lambda seconds, cancel: waits.append(seconds) or False)
    with ScriptedLLM([{"error": {"status": 429, "headers": {"Retry-After": "30"}}}, {"text": "never"}]) as llm:
        reply = provider(llm, max_retries=None, retry_budget_s=10.0, max_retry_wait_s=60).stream("", HELLO, [])
        assert len(llm.requests) == 1 and waits == []   # (no wait at all: it gave up at once)
    assert reply.error_message.startswith("HTTP 429 from "), reply.error_message
    assert reply.error_message.endswith(
        "(the server asked to wait 30 s, past what the retry budget of 10 s left: --retry-budget)"), reply.error_message


@pytest.mark.parametrize("api", BOTH)
def test_unreachable_endpoint_is_an_error_not_an_exception(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pid.providers import retry
    waits: list[float] = []
    monkeypatch.setattr(retry, "interruptible_wait", lambda seconds, cancel: waits.append(seconds) or False)
    config = ProviderConfig(model="m", base_url=f"http://127.0.0.1:{closed_port()}/v1", api=api, **FAST_RETRIES)
    reply = make_provider(config).stream("", HELLO, [])
    assert len(waits) == 2 and all(w <= FAST_RETRIES["max_retry_wait_s"] for w in waits)   # short, and few
    assert reply.stop_reason == "error"
    assert reply.error_message.startswith("cannot reach http://127.0.0.1:")
    assert "after 3 attempts" in reply.error_message


MALFORMED_ANSWERS = {
    "a redirect whose Location has a control byte": b"HTTP/1.1 302 Found\r\nLocation: http://x/\x01y\r\n"
                                                    b"Content-Length: 0\r\n\r\n",
    "not HTTP at all": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "a broken chunk": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zz\r\ndata: {}\r\n",
}


@pytest.mark.parametrize("answer", sorted(MALFORMED_ANSWERS))
def test_an_answer_that_is_not_http_is_tried_three_times_not_for_the_whole_budget(answer: str, tmp_path) -> None:
    """A hostile or broken endpoint that answers every request with bytes no HTTP reader takes gets the same answer
    again: the call ends after three attempts with the reader's reason, not after the 15 minutes of retries that a
    dropped connection is worth."""
    replay = tmp_path / "answer"
    replay.write_bytes(MALFORMED_ANSWERS[answer])
    notices: list[Any] = []
    with ScriptedLLM([{"replay": str(replay)}] * 5) as llm:
        reply = provider(llm, max_retries=None, retry_budget_s=900.0).stream("", HELLO, [], on_retry=notices.append)
        assert len(llm.requests) == 3, answer
    assert reply.stop_reason == "error" and "after 3 attempts" in reply.error_message, reply.error_message
    assert [n.reason for n in notices] == ["malformed response"] * 2


CUT_SHORT = {   # connections that end before the answer does: a server restarting, a proxy cutting it
    "before any answer": (b"", "connection failed"),
    "inside a chunk's size line": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\ne\r\ndata: {\"a\":1}\n\r\n1", "stream broke"),
}


@pytest.mark.parametrize("cut", sorted(CUT_SHORT))
def test_a_connection_cut_short_is_still_retried_as_before(cut: str, tmp_path) -> None:
    """No malformed answer: retried (here three times), and the call goes through."""
    replay = tmp_path / "cut"
    replay.write_bytes(CUT_SHORT[cut][0])
    notices: list[Any] = []
    with ScriptedLLM([{"replay": str(replay)}] * 3 + [{"text": "ok"}]) as llm:
        reply = provider(llm, max_retries=None).stream("", HELLO, [], on_retry=notices.append)
    assert reply.text == "ok", reply.error_message
    assert [n.reason for n in notices] == [CUT_SHORT[cut][1]] * 3


def test_malformed_answers_are_counted_in_a_row_not_with_the_failures_before_them(tmp_path) -> None:
    """Two 503s while a server restarts, then two answers that are not HTTP, then the reply: the malformed ones are
    two in a row, within their three attempts, and the call goes through."""
    replay = tmp_path / "answer"
    replay.write_bytes(MALFORMED_ANSWERS["not HTTP at all"])
    script = [{"error": {"status": 503}}] * 2 + [{"replay": str(replay)}] * 2 + [{"text": "ok"}]
    notices: list[Any] = []
    with ScriptedLLM(script) as llm:
        reply = provider(llm, max_retries=None).stream("", HELLO, [], on_retry=notices.append)
    assert reply.text == "ok", reply.error_message
    assert [n.reason for n in notices] == ["server error"] * 2 + ["malformed response"] * 2


@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("caller", ["the same provider", "its sibling"])
def test_an_endpoint_that_answered_then_refuses_is_waited_for_as_it_restarts(api: str, caller: str) -> None:
    """A refusal from an endpoint that never answered is most likely a wrong URL (three attempts, above); once it
    has answered the job, it is a server restarting (a local one reloading its model): waited for, within the
    retry budget, and the call then goes through. A sibling (compaction's summary call) knows it answered too."""
    with ScriptedLLM([{"text": "first"}]) as llm:
        port, first = llm.port, provider(llm, api, max_retries=None, retry_budget_s=30.0)
        assert first.stream("", HELLO, []).text == "first"
    p = first if caller == "the same provider" else first.sibling(dataclasses.replace(first.config, max_tokens=64))
    restarted: list[ScriptedLLM] = []
    restart = threading.Timer(0.8, lambda: restarted.append(ScriptedLLM([{"text": "again"}], port=port).start()))
    restart.start()
    notices: list[Any] = []
    try:
        reply = p.stream("", HELLO, [], on_retry=notices.append)
    finally:
        restart.join()
        for server in restarted:
            server.close()
        p.close()
        first.close()
    assert (reply.stop_reason, reply.text) == ("stop", "again"), reply.error_message
    assert len(notices) > 3 and notices[-1].reason == "unreachable"   # more than a wrong URL's three attempts


@pytest.mark.parametrize("api", BOTH)
def test_cancel_during_a_stalled_stream_aborts_promptly_with_partial_content(api: str) -> None:
    cancel = threading.Event()
    deltas: list[str] = []
    # Anthropic: message_start, ping, block start, first text delta; OpenAI: role chunk, first text chunk.
    stall_after = 4 if api == ANTHROPIC else 2

    def first_delta(text: str) -> None:   # the cancel comes as the server goes silent for 30 s
        deltas.append(text)
        cancel.set()
    with ScriptedLLM([{"text": "first part and then the rest", "stall_s": 30, "stall_after": stall_after}]) as llm:
        p = provider(llm, api)
        reply = p.stream("", HELLO, [], cancel=cancel, on_text=first_delta)
        assert llm.remaining == 0 and len(llm.requests) == 1
    assert reply.stop_reason == "aborted"   # (had the cancel waited out the silence, the rest would have come)
    assert deltas and reply.text == deltas[0] and "first part and then the rest".startswith(reply.text)


def cancel_once_asked(llm: ScriptedLLM, cancel: threading.Event) -> None:
    """Set `cancel` once the server has the request (not after a time the request may not yet have been sent)."""
    def watch() -> None:
        while not llm.requests:
            time.sleep(0.01)
        cancel.set()
    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.parametrize("api", BOTH)
def test_cancel_before_the_server_answers_aborts_promptly(api: str) -> None:
    cancel = threading.Event()
    with ScriptedLLM([{"text": "late", "delay_s": 30}]) as llm:
        cancel_once_asked(llm, cancel)   # the server has the request, and says nothing for 30 s
        reply = provider(llm, api).stream("", HELLO, [], cancel=cancel)
    assert reply.stop_reason == "aborted" and reply.content == []   # (waited out, the reply would be "late")


def test_a_provider_keeps_working_after_a_cancel() -> None:
    cancel = threading.Event()
    with ScriptedLLM([{"text": "slow", "stall_s": 30}, {"text": "next"}]) as llm:
        p = provider(llm)
        cancel_once_asked(llm, cancel)
        assert p.stream("", HELLO, [], cancel=cancel).stop_reason == "aborted"
        assert p.stream("", HELLO, [], cancel=threading.Event()).text == "next"


def test_already_cancelled_sends_nothing() -> None:
    cancel = threading.Event()
    cancel.set()
    with ScriptedLLM([{"text": "x"}]) as llm:
        reply = provider(llm).stream("", HELLO, [], cancel=cancel)
        assert reply.stop_reason == "aborted" and llm.requests == []


@pytest.mark.parametrize("api", BOTH)
def test_a_silent_server_hits_the_read_timeout(api: str) -> None:
    with ScriptedLLM([{"text": "never finished", "stall_s": 30}]) as llm:
        reply = provider(llm, api, read_timeout_s=0.5).stream("", HELLO, [], cancel=threading.Event())
    assert reply.stop_reason == "error" and "silent" in reply.error_message   # (not the rest, 30 s later)


@pytest.mark.parametrize("api", BOTH)
def test_a_stream_that_ends_without_finishing_is_an_error_keeping_the_content(api: str) -> None:
    with ScriptedLLM([{"text": "half an answ", "cut": True}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [])
    assert reply.stop_reason == "error" and "ended before" in reply.error_message
    assert reply.text == "half an answ"


@pytest.mark.parametrize("api", BOTH)
def test_an_error_event_mid_stream_is_reported(api: str) -> None:
    with ScriptedLLM([{"stream_error": "Overloaded, try later"}]) as llm:
        reply = provider(llm, api).stream("", HELLO, [])
    assert reply.stop_reason == "error" and "Overloaded, try later" in reply.error_message


@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("kind", ["text", "thinking", "arguments", "line"])
def test_an_endless_reply_stops_at_the_bound_with_a_clear_error(api: str, kind: str) -> None:
    """Issue 21, finding 6: a server that streams forever (deltas of text, thinking or a tool call's arguments, or one
    line that never ends) grew the job without bound. pid stops reading past MAX_REPLY_BYTES (an event past
    MAX_EVENT_BYTES), closes the connection, and the turn ends with an error saying so; what it kept is bounded."""
    with ScriptedLLM([{"endless": kind}, {"text": "the next call works"}]) as llm:
        p = provider(llm, api)
        reply = p.stream("", HELLO, [BASH])
        with llm.endless_done:   # the server's side: it saw the client hang up, and sent a bounded amount
            assert llm.endless_done.wait_for(lambda: llm.endless, timeout=60)
        sent, closed = llm.endless[0]
        assert p.stream("", HELLO, [BASH]).text == "the next call works"
    assert reply.stop_reason == "error"
    expected = f"a stream event of more than {MAX_EVENT_BYTES} bytes" if kind == "line" else \
        f"reply exceeded {MAX_REPLY_BYTES} bytes (4 MiB) of text, thinking and tool-call arguments"
    assert expected in reply.error_message
    assert closed and sent < ENDLESS_CAP // 2   # (what the sockets' buffers held beyond what pid read)
    kept = sum(len(c.text) if isinstance(c, TextContent) else len(c.thinking) if isinstance(c, ThinkingContent)
               else len(json.dumps(c.arguments)) + len(c.raw_arguments or "") for c in reply.content)
    assert kept <= MAX_REPLY_BYTES + ENDLESS_PIECE


@pytest.mark.parametrize("api", BOTH)
def test_connections_are_kept_alive_across_calls(api: str) -> None:
    with ScriptedLLM([{"text": "one"}, {"tool_calls": [{"name": "bash", "arguments": {}}]}, {"text": "three"}]) as llm:
        p = provider(llm, api)
        for _ in range(3):
            assert p.stream("", HELLO, [BASH]).stop_reason in ("stop", "toolUse")
        assert llm.connections_opened == 1


def test_unknown_api_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown provider api"):
        make_provider(ProviderConfig(model="m", api="carrier-pigeon"))


# -- OpenAI request shape and leniency --------------------------------------------------------------------------

def conversation() -> list:
    png = ImageContent("iVBORw0KGgo=", "image/png")
    return [
        UserMessage([TextContent("what is in "), TextContent("this repo?")]),
        AssistantMessage([TextContent("Let me look."), ToolCall("call_a", "bash", {"command": "ls"}),
                          ToolCall("call_b", "read", {"path": "logo.png"})], stop_reason="toolUse"),
        ToolResultMessage("call_a", "bash", [TextContent("README.md\nlogo.png")]),
        ToolResultMessage("call_b", "read", [TextContent("Read image file [image/png]"), png]),
        AssistantMessage([TextContent("A readme and a logo.")]),
        UserMessage([TextContent("and this?"), png]),
    ]


def test_openai_request_body_shape() -> None:
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, api_key="sk-test", max_tokens=1234, temperature=0.2).stream("SYSTEM", conversation(), [BASH])
        body, headers = llm.requests[0], llm.request_headers[0]
    assert headers["authorization"] == "Bearer sk-test"
    assert (body["model"], body["stream"], body["stream_options"]) == ("test-model", True, {"include_usage": True})
    assert (body["max_tokens"], body["temperature"]) == (1234, 0.2)
    assert body["tools"] == [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                                               "parameters": BASH.parameters}}]
    m = body["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "tool", "user", "assistant", "user"]
    assert m[0] == {"role": "system", "content": "SYSTEM"}
    assert m[1] == {"role": "user", "content": "what is in this repo?"}
    assert m[2]["content"] == "Let me look."
    assert m[2]["tool_calls"][0] == {"id": "call_a", "type": "function",
                                     "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    assert m[3] == {"role": "tool", "tool_call_id": "call_a", "content": "README.md\nlogo.png"}
    assert m[4] == {"role": "tool", "tool_call_id": "call_b", "content": "Read image file [image/png]"}
    assert m[5]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert m[7]["content"] == [{"type": "text", "text": "and this?"},
                               {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]


@pytest.mark.parametrize("api", BOTH)
def test_request_bytes_are_the_request_body_in_json_whatever_changed_between_calls(api: str) -> None:
    """The body is sent from kept per-message JSON; it must be exactly json.dumps(request_body) when the
    conversation grows (also by runs of tool results with images), is compacted, replaced, or the system prompt or
    the tools change, with and without images, limits and thinking."""
    for settings in ({}, {"max_tokens": 99, "temperature": 0.5, "thinking": "high"}, {"images": False},
                     {"temperature": 0.5, "model_max_tokens": 5000}):
        p = make_provider(ProviderConfig(model="test-model", base_url="http://127.0.0.1:9/v1", api=api,
                                         **settings))  # type: ignore[arg-type]
        whole = conversation()
        read = ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
        schema_changed = ToolSpec("bash", "Run a command.", {**BASH.parameters, "required": []})
        steps: list[tuple[str, list[Any], list[ToolSpec]]] = [("SYS", whole[:n], [BASH]) for n in range(len(whole) + 1)]
        steps += [("SYS", whole[:4], [BASH]),                          # shorter: a compaction or a new agent
                  ("SYS", [UserMessage.text("summary")] + whole[3:], [BASH, read]),
                  ("OTHER", [UserMessage.text("summary")] + whole[3:], [schema_changed]),
                  ("", whole + [AssistantMessage([ThinkingContent("hmm", "reasoning_content"), TextContent("ok")],
                                                 api=api, model="test-model")], []),
                  ("", whole + [AssistantMessage([ThinkingContent("hmm", "sig"), TextContent("")], api=api,
                                                 model="test-model"), UserMessage([TextContent("")])], []),
                  ("", list(whole), []), ("", [], [])]
        for system, messages, tools in steps:
            sent = p.request_bytes(system, messages, tools)
            assert sent == json.dumps(p.request_body(system, messages, tools)).encode(), (settings, len(messages))
        p.close()


@pytest.mark.parametrize("api", BOTH)
def test_a_request_that_could_not_be_encoded_leaves_nothing_behind(api: str) -> None:
    p = make_provider(ProviderConfig(model="test-model", base_url="http://127.0.0.1:9/v1", api=api))
    good = conversation()[:3]
    bad = AssistantMessage([ToolCall("call_x", "bash", {"command": {1, 2}})], stop_reason="toolUse")  # a set
    with pytest.raises(TypeError):
        p.request_bytes("SYS", good + [bad], [BASH])
    assert p.request_bytes("SYS", good, [BASH]) == json.dumps(p.request_body("SYS", good, [BASH])).encode()
    p.close()


def test_openai_request_without_key_tools_or_limits() -> None:
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm).stream("", HELLO, [])
        body, headers = llm.requests[0], llm.request_headers[0]
    assert "authorization" not in headers
    assert not {"tools", "max_tokens", "temperature"} & body.keys()
    assert body["messages"] == [{"role": "user", "content": "hello"}]


def sse(*chunks: Any) -> list[str]:
    return [c if isinstance(c, str) else f"data: {json.dumps(c)}\n\n" for c in chunks]


def test_openai_leniency_for_other_servers() -> None:
    """No tool-call index, `data:` without a space, comments, usage beside choices, `reasoning`, no [DONE]."""
    raw = sse(": OPENROUTER PROCESSING\n\n",
              {"id": "gen-1", "choices": [{"delta": {"role": "assistant", "reasoning": "Think"}}]},
              'data:{"id": "gen-1", "choices": [{"delta": {"reasoning": "ing."}}]}\n\n',
              {"id": "gen-1", "choices": [{"delta": {"content": "Hi"}, "extra": 1}], "provider": "x"},
              {"choices": [{"delta": {"tool_calls": [{"id": "t1",
                                                      "function": {"name": "bash", "arguments": "{\"co"}}]}}]},
              {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "mmand\": \"ls\"}"}}]}}]},
              {"choices": [{"delta": {"tool_calls": [{"id": "t2", "function": {"name": "read",
                                                                               "arguments": "{\"path\": \"x\"}"}}]}}]},
              {"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    with ScriptedLLM([{"raw": raw}]) as llm:
        reply = provider(llm).stream("", HELLO, [BASH])
    assert reply.stop_reason == "toolUse", reply.error_message
    assert [c.type for c in reply.content] == ["thinking", "text", "toolCall", "toolCall"]
    assert reply.content[0].thinking == "Thinking." and reply.text == "Hi"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("t1", "bash", {"command": "ls"}),
                                                                       ("t2", "read", {"path": "x"})]
    assert (reply.usage.input, reply.usage.output, reply.response_id) == (10, 5, "gen-1")


def test_llama_cpp_python_s_function_call_beside_tool_calls_is_not_appended_twice() -> None:
    """llama-cpp-python 0.3.36 repeats each argument fragment in the legacy `function_call` within the same delta
    (as issue 20 describes its stream; written here, not recorded). Alone, `function_call` is one tool call."""
    def both(arguments: str, first: bool = False) -> dict:
        call = {"name": "bash", "arguments": arguments} if first else {"arguments": arguments}
        return {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "function_call": call,
                                                   "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                                   "function": call}] if first else
                                                   [{"index": 0, "function": call}]}}]}
    doubled = sse(both('{"command"', first=True), both(': "ls", "timeout": 4096}'),
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}, "data: [DONE]\n\n")
    legacy = sse({"choices": [{"delta": {"function_call": {"name": "bash", "arguments": '{"command": '}}}]},
                 {"choices": [{"delta": {"function_call": {"arguments": '"pwd"}'}}}]},
                 {"choices": [{"delta": {}, "finish_reason": "function_call"}]})
    with ScriptedLLM([{"raw": doubled}, {"raw": legacy}]) as llm:
        p = provider(llm)
        reply = p.stream("", HELLO, [BASH])
        assert reply.stop_reason == "toolUse", reply.error_message
        assert [(c.name, c.arguments, c.raw_arguments) for c in reply.tool_calls] == [
            ("bash", {"command": "ls", "timeout": 4096}, None)]
        alone = p.stream("", HELLO, [BASH])
    assert [(c.name, c.arguments) for c in alone.tool_calls] == [("bash", {"command": "pwd"})]


def test_openai_requests_say_tool_choice_and_give_a_tool_call_an_empty_content() -> None:
    """tool_choice "auto" whenever tools are offered (llama-cpp-python drops the tools without it), and `"content":
    ""` on an assistant message that only calls tools (llama-cpp-python answers a null one with HTTP 500 and a
    missing one with an empty stream)."""
    call = AssistantMessage(content=[ToolCall("c1", "bash", {"command": "ls"})], stop_reason="toolUse")
    history = [*HELLO, call, ToolResultMessage("c1", "bash", [TextContent("a b")])]
    with ScriptedLLM([{"text": "ok"}, {"text": "ok"}]) as llm:
        p = provider(llm)
        p.stream("", history, [BASH])
        p.stream("", HELLO, [])
        with_tools, without = llm.requests
    assert with_tools["tool_choice"] == "auto" and "tool_choice" not in without and "tools" not in without
    assert with_tools["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}


def test_openai_requests_carry_the_answer_s_token_limit_as_pi_sends_it() -> None:
    """--max-tokens when given; else the model table's maxTokens, at most 32000; none for a model nobody knows (a
    local server would otherwise generate until its context is full, when the table does know the model)."""
    with ScriptedLLM([{"text": "ok"}] * 3) as llm:
        provider(llm, max_tokens=512).stream("", HELLO, [])
        provider(llm, model_max_tokens=128000).stream("", HELLO, [])
        provider(llm).stream("", HELLO, [])
        given, known, unknown = llm.requests
    assert (given["max_tokens"], known["max_tokens"], "max_tokens" in unknown) == (512, 32000, False)


def test_openai_done_without_finish_reason_and_ollama_style_stop_with_tools() -> None:
    raw = sse({"choices": [{"delta": {"content": "x"}}]}, "data: [DONE]\n\n")
    tools = sse({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        "finish_reason": "stop"}]}, "data: [DONE]\n\n")
    with ScriptedLLM([{"raw": raw}, {"raw": tools}]) as llm:
        p = provider(llm)
        assert p.stream("", HELLO, []).stop_reason == "stop"
        reply = p.stream("", HELLO, [])
    assert reply.stop_reason == "toolUse" and reply.tool_calls[0].arguments == {"command": "ls"}


@pytest.mark.parametrize("api", BOTH)
def test_a_compressed_stream_is_decoded(api: str) -> None:
    """A server that gzips its event stream (some proxies do): the events are read from the decoded bytes, and the
    connection is kept for the next, plain request."""
    turns = [{"text": "squeezed reply", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
              "gzip": True}, {"text": "plain"}]
    with ScriptedLLM(turns) as llm:
        p = provider(llm, api)
        reply = p.stream("", HELLO, [BASH])
        assert (reply.stop_reason, reply.text) == ("toolUse", "squeezed reply"), reply.error_message
        assert reply.tool_calls[0].arguments == {"command": "ls"}
        assert p.stream("", HELLO, [BASH]).text == "plain"
        assert llm.connections_opened == 1


def _gzip(parts: Any) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join([*(packer.compress(part) for part in parts), packer.flush()])


@functools.cache
def _zeros_gzipped() -> bytes:
    """Eight times MAX_EVENT_BYTES of zeros, gzipped (~64 KB): far past any bound, and made in a fraction of a second
    (the attack's GiB took seconds to pack). Run-length matching only (as small as the default's, for zeros) packs it
    twice as fast."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31, 9, zlib.Z_RLE)
    zeros = b"\0" * MAX_EVENT_BYTES
    return b"".join([*(packer.compress(zeros) for _ in range(8)), packer.flush()])


class RawServer:
    """One canned HTTP response, whatever the request: a compressed body a few KB long. `framed`: the body carries
    its own framing (chunked), so no Content-Length."""

    def __init__(self, head: str, body: bytes, framed: bool = False) -> None:
        length = "" if framed else f"Content-Length: {len(body)}\r\n"
        self.response = head.encode() + f"{length}\r\n".encode() + body
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 20)
                conn.settimeout(30)
                try:
                    conn.sendall(self.response)
                    conn.shutdown(socket.SHUT_WR)
                    while conn.recv(65536):   # (the rest of the request: closing on unread bytes resets)
                        pass
                except OSError:
                    pass


@pytest.mark.parametrize("status, encoding", [("200 OK", "gzip"), ("200 OK", "gzip, gzip"),
                                              ("500 Internal Server Error", "gzip, gzip")])
def test_a_compressed_body_is_decoded_in_bounded_steps(status: str, encoding: str) -> None:
    """A few KB that inflate to a GiB (`gzip, gzip`: one GiB of zeros, packed twice, is 2 KB) made pid's process take
    gigabytes: httpx inflated each piece whole before any bound was checked. pid decodes the body itself, one layer
    of gzip at most, a bounded step at a time: the reply fails with what is wrong, and memory stays flat."""
    inner = _zeros_gzipped()
    body = inner if encoding == "gzip" else _gzip([inner])
    server = RawServer(f"HTTP/1.1 {status}\r\nContent-Type: text/event-stream\r\nContent-Encoding: {encoding}\r\n",
                       body)
    try:
        p = OpenAIProvider(ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=0))
        reply = p.stream("", HELLO, [])
    finally:
        server.sock.close()
    assert reply.stop_reason == "error", reply
    if status.startswith("500"):
        assert "HTTP 500" in reply.error_message and "encoding pid does not read" in reply.error_message
    elif encoding == "gzip":
        assert f"more than {MAX_EVENT_BYTES} bytes" in reply.error_message, reply.error_message
    else:
        assert "content encoding pid does not read (gzip, gzip)" in reply.error_message, reply.error_message


def test_openai_malformed_stream_data_is_an_error() -> None:
    with ScriptedLLM([{"raw": sse({"choices": [{"delta": {"content": "ok"}}]}, "data: {broken\n\n")}]) as llm:
        reply = provider(llm).stream("", HELLO, [])
    assert reply.stop_reason == "error" and "malformed" in reply.error_message and reply.text == "ok"


# -- Anthropic request shape ---------------------------------------------------------------------------------------

def test_anthropic_request_body_shape() -> None:
    messages = conversation()
    messages[3].is_error = True
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC, api_key="sk-ant").stream("SYSTEM", messages, [BASH])
        body, headers = llm.requests[0], llm.request_headers[0]
    assert llm.paths[0] == "/v1/messages"
    assert (headers["x-api-key"], headers["anthropic-version"]) == ("sk-ant", "2023-06-01")
    assert "authorization" not in headers
    assert (body["model"], body["max_tokens"], body["stream"]) == ("test-model", 8192, True)
    assert body["system"][0]["text"] == "SYSTEM"
    assert body["tools"] == [{"name": "bash", "description": "Run a command.", "input_schema": BASH.parameters}]
    m = body["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant", "user"]
    assert m[1]["content"][1] == {"type": "tool_use", "id": "call_a", "name": "bash", "input": {"command": "ls"}}
    results = m[2]["content"]
    assert [(r["type"], r["tool_use_id"], r["is_error"]) for r in results] == [
        ("tool_result", "call_a", False), ("tool_result", "call_b", True)]
    assert results[1]["content"][1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                    "data": "iVBORw0KGgo="}}
    assert m[4]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_anthropic_thinking_is_kept_with_its_signature_and_replayed() -> None:
    with ScriptedLLM([{"thinking": "Let me consider.", "text": "Answer."}, {"text": "ok"}]) as llm:
        p = provider(llm, ANTHROPIC)
        reply = p.stream("", HELLO, [])
        thinking = reply.content[0]
        assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", "Let me consider.",
                                                                          "sig-scripted-1")
        p.stream("", HELLO + [reply, UserMessage.text("more")], [])
        replayed = llm.requests[1]["messages"][1]["content"]
    assert replayed[0] == {"type": "thinking", "thinking": "Let me consider.", "signature": "sig-scripted-1"}


def test_anthropic_default_base_url_is_anthropics() -> None:
    p = AnthropicProvider(ProviderConfig(model="claude", api=ANTHROPIC))
    assert p._url == "https://api.anthropic.com/v1/messages"


# -- standalone server and overhead -------------------------------------------------------------------------------

def test_standalone_server_serves_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "turns.json"
    script.write_text(json.dumps({"turns": [{"text": "from another process"}]}))
    proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_llm", "--script", str(script)],
                            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[1]))
    try:
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        p = make_provider(ProviderConfig(model="m", base_url=base_url))
        assert p.stream("", HELLO, []).text == "from another process"
        assert p.stream("", HELLO, []).text == "script exhausted"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_no_response_within_the_read_timeout_is_an_error() -> None:
    with ScriptedLLM([{"text": "late", "delay_s": 30}, {"text": "must not be reached"}]) as llm:
        reply = provider(llm, read_timeout_s=0.4).stream("", HELLO, [])
        assert len(llm.requests) == 1
    assert reply.stop_reason == "error" and "timed out waiting for a response" in reply.error_message


@pytest.mark.parametrize("api, host", [(OPENAI, "api.openai.com"), (ANTHROPIC, "api.anthropic.com")])
def test_a_vendor_endpoint_without_a_key_fails_at_once_saying_so(api: str, host: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from pid.providers import transport
    tried: list[str] = []
    monkeypatch.setattr(transport, "stream_request", lambda client, url, **_: tried.append(url))
    p = make_provider(ProviderConfig(model="m", api=api, api_key=None, provider="x"))   # the vendor's default URL
    reply = p.stream("", HELLO, [])
    assert reply.stop_reason == "error" and reply.error_message.startswith(f"no API key: {host} needs one")
    assert tried == []   # no request was tried


def test_arguments_with_a_raw_newline_in_a_string_are_taken() -> None:
    """llama-cpp-python streams the model's own characters: a newline typed inside a JSON string arrives raw (strict
    JSON refuses it; the call used to fail as invalid JSON)."""
    from pid.providers.openai import parse_arguments
    assert parse_arguments('{"command": "ls\n-la"}') == ({"command": "ls\n-la"}, None)
    assert parse_arguments('{"command": "ls"') == ({}, '{"command": "ls"')


def test_arguments_nested_too_deep_are_malformed_not_a_crash() -> None:
    from pid.providers.openai import parse_arguments
    deep = "[" * 100_000
    assert parse_arguments(deep) == ({}, deep)
    assert parse_arguments('{"a": ' * 5000 + "1" + "}" * 5000) == ({}, '{"a": ' * 5000 + "1" + "}" * 5000)


def test_a_stream_of_empty_events_ends_at_the_stream_bound(monkeypatch) -> None:
    """Events that add nothing to the reply (`{"choices": []}`, sent forever) are not counted by the reply's own
    bound: the stream's bound ends them (lowered here from its 256 MiB)."""
    from pid.providers import transport
    monkeypatch.setattr(transport, "MAX_STREAM_BYTES", 1 << 20)
    body = b'data: {"choices": []}\n\n' * ((2 << 20) // 23)
    server = RawServer("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", body)
    try:
        reply = OpenAIProvider(ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=0)).stream(
            "", HELLO, [])
    finally:
        server.sock.close()
    assert reply.stop_reason == "error" and "passed 1 MiB" in reply.error_message, reply


@pytest.mark.parametrize("kind, body", [("text/html", b"<html><body>It works!</body></html>"),
                                        ("application/json", b'{"object": "chat.completion", "choices": []}')])
def test_a_reply_that_is_not_an_event_stream_is_the_endpoints_mistake_not_an_overflow(kind: str, body: bytes) -> None:
    """A 200 that says it is a web page or a whole JSON body (a --base-url that is not the API's, a proxy that does
    not stream) has no event: that is said as it is, once, and never taken for a conversation too long for the model
    (as an empty event stream is: some servers answer so)."""
    from pid.providers.overflow import is_context_overflow
    server = RawServer(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\n", body)
    try:
        reply = OpenAIProvider(ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=3)).stream(
            "", HELLO, [])
    finally:
        server.sock.close()
    assert reply.stop_reason == "error" and not is_context_overflow(reply)
    assert reply.error_message == (f"the server answered with {kind}, not an event stream: is --base-url the API's "
                                   "own (an OpenAI-compatible one usually ends in /v1)?")


def _raw_reply(body: bytes, *, api: str = "openai", kind: str = "text/event-stream", headers: str = "",
               framed: bool = False, **config_fields: Any) -> AssistantMessage:
    """The reply a provider makes of one canned response (`headers`: more of them, each ending in CRLF)."""
    server = RawServer(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\n{headers}", body, framed)
    try:
        config = ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=3, api=api, **config_fields)
        provider = AnthropicProvider(config) if api == ANTHROPIC else OpenAIProvider(config)
        return provider.stream("", HELLO, [])
    finally:
        server.sock.close()


@pytest.mark.parametrize("body", [b"this is not sse at all\n", b"<html><body>It works!</body></html>\n"])
def test_an_event_stream_of_no_events_but_other_text_is_said_as_it_is_never_an_overflow(body: bytes) -> None:
    """A body labelled as an event stream whose lines are no SSE fields is not the empty answer some servers give a
    conversation too long for them (retried, then compacted: a CI job ended context_overflow for 1,235 tokens): the
    job fails at once, quoting what came."""
    from pid.providers.overflow import is_context_overflow
    reply = _raw_reply(body)
    assert reply.stop_reason == "error" and not is_context_overflow(reply), reply
    assert reply.error_message == "the server's reply is not a stream of events; it began: " + body.decode().strip()


@pytest.mark.parametrize("api, body", [
    ("openai", b"data: [DONE]\n\n"),
    ("openai", b'data: {"id": "x", "choices": []}\n\ndata: [DONE]\n\n'),
    (ANTHROPIC, b'event: message_stop\ndata: {"type": "message_stop"}\n\n')])
def test_a_stream_with_no_answer_at_all_is_an_error_not_a_completed_job(api: str, body: bytes) -> None:
    """No content and no finish reason (not even an empty answer): a CI step without a check took this for a job
    completed, exit 0."""
    reply = _raw_reply(body, api=api)
    assert (reply.stop_reason, reply.error_message) == (
        "error", "the server's stream held no answer (no content and no finish reason)"), reply


def test_an_empty_answer_with_its_finish_reason_is_still_an_answer() -> None:
    body = b'data: {"choices": [{"delta": {"content": ""}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    reply = _raw_reply(body)
    assert (reply.stop_reason, reply.error_message) == ("stop", None), reply


@pytest.mark.parametrize("chunk", [b'{"choices": [{"delta": {"content": 42}}]}', b'{"choices": "x"}',
                                   b'{"choices": ["x"]}', b'{"choices": [{"delta": "x"}]}'])
def test_a_chunk_not_shaped_as_a_chat_completion_fails_the_reply_saying_so(chunk: bytes) -> None:
    """Content that is a number was dropped without a word; `choices` as a string failed with Python's own words
    (AttributeError)."""
    reply = _raw_reply(b"data: " + chunk + b"\n\ndata: [DONE]\n\n")
    assert reply.stop_reason == "error", reply
    assert reply.error_message.startswith("malformed stream data from the server (not the shape of a chat "
                                          "completion chunk): "), reply.error_message


_ANSWER = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'
_A_TEXT = (b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
           b'"content_block": {"type": "text", "text": "hi"}}\n\n')
_A_END = (b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}\n\n'
          b'event: message_stop\ndata: {"type": "message_stop"}\n\n')


@pytest.mark.parametrize("api, body", [
    ("openai", _ANSWER + b'data: {"choices": [], "usage": [1, 2]}\n\ndata: [DONE]\n\n'),
    ("openai", _ANSWER + b'data: {"choices": [], "usage": "lots"}\n\ndata: [DONE]\n\n'),
    (ANTHROPIC, b'event: message_start\ndata: {"type": "message_start", "message": {"id": ["x"], "usage": [1]}}\n\n'
     + _A_TEXT + b'event: message_delta\ndata: {"type": "message_delta", "delta": ["x"], "usage": "lots"}\n\n'
     + _A_END)])
def test_a_usage_not_shaped_as_one_is_no_usage(api: str, body: bytes) -> None:
    """A usage that is no object failed the job with Python's words, its call uncounted (an attack review's:
    `'list' object has no attribute 'get'`, escaping the provider): now it is no usage, as a missing one."""
    reply = _raw_reply(body, api=api)
    assert (reply.stop_reason, reply.text, reply.usage.input, reply.usage.output) == ("stop", "hi", 0, 0), reply
    assert reply.response_id is None or isinstance(reply.response_id, str)


@pytest.mark.parametrize("calls", [b'[1]', b'"x"', b'[{"index": [0], "function": {"name": "bash"}}]',
                                   b'[{"index": 0, "function": "bash"}]', b'[{"index": true, "function": {}}]'])
def test_a_tool_call_not_shaped_as_one_fails_the_reply_saying_so(calls: bytes) -> None:
    """They failed with Python's words (AttributeError, unhashable type), a review's."""
    reply = _raw_reply(b'data: {"choices": [{"delta": {"tool_calls": ' + calls + b'}}]}\n\ndata: [DONE]\n\n')
    assert reply.stop_reason == "error", reply
    assert reply.error_message.startswith("malformed stream data from the server (not the shape of a tool call): "), \
        reply.error_message


def test_a_finish_reason_that_is_no_string_still_ends_the_answer() -> None:
    """(It was looked up as a key: a dict raised TypeError out of the provider.)"""
    reply = _raw_reply(b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": {"x": 1}}]}\n\n'
                       b"data: [DONE]\n\n")
    assert (reply.stop_reason, reply.text, reply.error_message) == ("stop", "hi", None), reply


@pytest.mark.parametrize("index", [b'"zz"', b"[0]", b"1.5", b"true"])
def test_a_content_block_index_that_is_no_whole_number_fails_the_reply_saying_so(index: bytes) -> None:
    """Indexes 0 and "zz" could not be put in order: the reply raised TypeError out of the provider (an attack
    review's), and a list as an index could not even be stored."""
    second = _A_TEXT.replace(b'"index": 0', b'"index": ' + index)
    reply = _raw_reply(_A_TEXT + second + _A_END, api=ANTHROPIC)
    assert reply.stop_reason == "error", reply
    assert reply.error_message.startswith("malformed stream data from the server: a content block's index is not a "
                                          "whole number: "), reply.error_message


def test_a_reply_the_provider_cannot_make_a_message_of_is_a_failed_message_never_an_exception(monkeypatch) -> None:
    """Whatever a server's data breaks in the last step (the message made of the reply) ends as the provider's
    failure, with the call still made and counted: the seam never raises."""
    from pid.providers import openai

    def broken(self, reply):
        raise TypeError("'<' not supported between instances of 'str' and 'int'")
    monkeypatch.setattr(openai.OpenAIProvider, "_message", broken)
    reply = _raw_reply(_ANSWER + b'data: {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}\n\n'
                       b"data: [DONE]\n\n")
    assert (reply.stop_reason, reply.content, reply.api) == ("error", [], "openai-completions"), reply
    assert (reply.usage.input, reply.usage.output) == (10, 2)   # (the call was made: what it used counts)
    assert reply.error_message == ("malformed reply from the server (TypeError: '<' not supported between instances "
                                   "of 'str' and 'int')"), reply.error_message


# -- what a hostile endpoint sends between and after events (from an attack review) ------------------------------

def test_empty_data_lines_count_toward_the_event_bound() -> None:
    """`data:` with nothing after it, sent forever without the blank line that ends an event: each adds a line to the
    event, and each counts (pid's memory grew by ~40 bytes per empty line, counted as none, to 738 MB in 40 s)."""
    import httpx

    from pid.providers.transport import EventTooLarge, iter_sse
    response = httpx.Response(200, stream=httpx.ByteStream(b"data:\n" * 2000))
    with pytest.raises(EventTooLarge):
        list(iter_sse(response, limit=1000))
    response = httpx.Response(200, stream=httpx.ByteStream(b"data:\ndata: a\ndata:\n\n"))
    assert list(iter_sse(response)) == [("", b"\na\n")]   # (the lines still join as SSE says)


def test_compressed_bytes_that_decode_to_nothing_count_toward_the_stream_bound(monkeypatch) -> None:
    """Empty deflate blocks (5 bytes each, nothing decoded) sent forever were never counted (a code review's)."""
    from pid.providers import transport
    monkeypatch.setattr(transport, "MAX_STREAM_BYTES", 1 << 20)
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    body = gzip_header + b"\x00\x00\x00\xff\xff" * (300_000)   # (stored blocks of length 0, none final)
    reply = _raw_reply(body, headers="Content-Encoding: gzip\r\n")
    assert reply.stop_reason == "error" and "passed 1 MiB" in reply.error_message, reply


def test_the_chunked_framing_counts_toward_the_stream_bound(monkeypatch) -> None:
    """Chunk extensions (`2;x=<50 KB>`) carry no body byte, and 1.8 GB of them passed a 1 MiB bound (an attack
    review's): every byte off the socket counts."""
    from pid.providers import transport
    monkeypatch.setattr(transport, "MAX_STREAM_BYTES", 1 << 20)
    framing = b"".join(b"2;x=" + b"a" * 50_000 + b"\r\n:\n\r\n" for _ in range(40))
    reply = (b'data: {"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": "stop"}]}\n\n'
             b"data: [DONE]\n\n")
    body = framing + f"{len(reply):x}\r\n".encode() + reply + b"\r\n0\r\n\r\n"
    got = _raw_reply(body, headers="Transfer-Encoding: chunked\r\n", framed=True)
    assert got.stop_reason == "error" and "passed 1 MiB" in got.error_message, got


def test_comment_lines_count_toward_the_stream_bound(monkeypatch) -> None:
    """Keep-alive comments (`:`) sent as fast as the socket goes add nothing to the reply, and were never counted:
    only the job's wall clock ended them. Every byte counts toward the stream's bound (lowered here)."""
    from pid.providers import transport
    monkeypatch.setattr(transport, "MAX_STREAM_BYTES", 1 << 20)
    reply = _raw_reply(b":\n" * (1 << 20))
    assert reply.stop_reason == "error" and "passed 1 MiB" in reply.error_message, reply


class TrickleServer:
    """A whole reply, then the connection kept open: `extra` sent every 0.2 s (or nothing), until the client goes;
    or, with `cut`, a chunk cut short and the connection closed."""

    def __init__(self, body: bytes, extra: bytes, cut: bool = False) -> None:
        self.body, self.extra, self.cut = body, extra, cut
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(1 << 20)
            chunk = lambda data: f"{len(data):x}\r\n".encode() + data + b"\r\n"   # noqa: E731
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                             b"\r\n" + chunk(self.body))
                if self.cut:
                    conn.sendall(b"64\r\nonly part of it")
                    return
                for _ in range(150):   # 30 s at most
                    time.sleep(0.2)
                    if self.extra:
                        conn.sendall(chunk(self.extra))
            except OSError:
                pass


@pytest.mark.parametrize("extra, cut, spent, ended", [
    (b":\n", False, False, True), (b"", False, False, True), (b"", True, False, True), (b"", False, True, True),
    (b":\n", False, False, False), (b"", False, False, False), (b"", True, False, False)],
    ids=["comments", "silence", "cut-short", "silence-near-the-stream-bound", "no-end-comments", "no-end-silence",
         "no-end-cut-short"])
def test_a_finished_reply_is_not_held_by_a_stream_that_stays_open(extra: bytes, cut: bool, spent: bool, ended: bool,
                                                                   monkeypatch) -> None:
    """A complete reply (its finish reason, its usage, and [DONE] or not), then the stream kept open, with a comment
    now and then or silent, or broken off: pid reads on only briefly (for the trailers of a reply that said it is
    complete, then to reuse the connection if its end comes soon), and whatever happens then costs nothing of the
    answer (the job waited for its wall clock, and lost the answer; near the stream's bound the drain had no
    deadline; a broken connection lost it: an attack review's and a code review's; without [DONE] the job was held:
    a new-user test's)."""
    from pid.providers import transport
    monkeypatch.setattr(transport, "TRAILER_S", 1.5)
    body = (b'data: {"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": "stop"}]}\n\n'
            b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}\n\n'
            + (b"data: [DONE]\n\n" if ended else b""))
    if spent:   # (less than DRAIN_BYTES of the stream's bound left when the reply is done)
        monkeypatch.setattr(transport, "MAX_STREAM_BYTES", 100_000)
        body = b":" + b"x" * 40_000 + b"\n" + body
    server = TrickleServer(body, extra, cut)
    replies: list[AssistantMessage] = []
    try:
        provider = OpenAIProvider(ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=0))
        worker = threading.Thread(target=lambda: replies.append(provider.stream("", HELLO, [])), daemon=True)
        started = time.monotonic()
        worker.start()
        worker.join(15)
    finally:
        server.sock.close()
    assert replies, "the reply never ended"
    assert time.monotonic() - started < 5
    assert replies[0].stop_reason == "stop" and replies[0].content == [TextContent("done")], replies[0]
    assert replies[0].usage.output == 7


def test_a_finish_reason_on_every_chunk_does_not_cut_the_reply() -> None:
    """Some OpenAI-compatible gateways put finish_reason on every chunk, not only the last: the reply goes on after
    one, and is read whole, past the trailers' bound (a review: it was cut at 64 KiB and taken as complete)."""
    piece = "x" * 49 + "\n"
    body = b"".join(b'data: {"choices": [{"index": 0, "delta": {"content": ' + json.dumps(piece).encode()
                    + b'}, "finish_reason": "stop"}]}\n\n' for _ in range(2000)) + b"data: [DONE]\n\n"
    server = TrickleServer(body, b"", False)
    try:
        provider = OpenAIProvider(ProviderConfig(model="m", base_url=server.url, api_key="k", max_retries=0))
        reply = provider.stream("", HELLO, [])
    finally:
        server.sock.close()
    assert reply.stop_reason == "stop" and reply.error_message is None, reply.error_message
    assert reply.content == [TextContent(piece * 2000)]


@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("count, expected", [("-2000000", 0), ("NaN", 0), ("-1.5e308", 0), ("1" + "0" * 309, 10**12),
                                             ('"12"', 0), ("true", 0), ("12.0", 12)])
def test_token_counts_are_made_sane(api: str, count: str, expected: int) -> None:
    """An endpoint's usage is its word, not pid's arithmetic: a negative count made a negative cost that got past
    --max-cost and crashed every command that printed it; NaN and 10**309 made a cost result.json could not hold, or
    an OverflowError out of the provider (an attack review's). Counts are whole numbers from 0 to 10**12."""
    from pid.costs import format_cost
    if api == OPENAI:
        body = ('data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}], '
                f'"usage": {{"prompt_tokens": 1000, "completion_tokens": {count}}}}}\n\ndata: [DONE]\n\n')
    else:
        body = (f'event: message_start\ndata: {{"type": "message_start", "message": {{"usage": {{"input_tokens": 1000, '
                f'"output_tokens": 1}}}}}}\n\n'
                'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
                '"content_block": {"type": "text", "text": "x"}}\n\n'
                'event: content_block_stop\ndata: {"type": "content_block_stop", "index": 0}\n\n'
                'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, '
                f'"usage": {{"output_tokens": {count}}}}}\n\n'
                'event: message_stop\ndata: {"type": "message_stop"}\n\n')
    reply = _raw_reply(body.encode(), api=api, input_cost_per_mtok=1.0, output_cost_per_mtok=1.0)
    assert reply.stop_reason == "stop", reply.error_message
    if api == ANTHROPIC and count in ('"12"', "true"):   # (no number: message_start's count stands)
        expected = 1
    assert (reply.usage.input, reply.usage.output) == (1000, expected)
    assert reply.usage.cost.total == pytest.approx((1000 + expected) / 1e6)
    format_cost(reply.usage.cost.total)


def test_a_cost_an_older_record_holds_is_printed_whatever_it_is() -> None:
    from pid.costs import format_cost
    assert [format_cost(x) for x in (-87.5, float("nan"), float("inf"), 0.5)] == ["$-87.5", "$nan", "$inf", "$0.50"]


@pytest.mark.parametrize("api", [OPENAI, ANTHROPIC])
def test_an_api_key_the_server_echoes_in_its_error_is_not_recorded(api: str) -> None:
    """Gateways quote the Authorization header in a 401 ("Incorrect API key provided: Bearer sk-…"): that text went
    into stderr, result.json, the session and the job store as it was (an attack review's). The key is replaced."""
    key = "sk-SECRET-KEY-123456"
    said = {"message": f"Incorrect API key provided: Bearer {key}"}
    with ScriptedLLM([{"error": {"status": 503, "body": {"error": said}}},   # (retried: a notice first)
                      {"error": {"status": 401, "body": {"error": said}}}]) as llm:
        notices: list[Any] = []
        reply = provider(llm, api, api_key=key, max_retries=1, retry_base_s=0.01).stream(
            "", HELLO, [], on_retry=notices.append)
    assert reply.stop_reason == "error" and "Incorrect API key provided: Bearer [the API key]" in reply.error_message
    assert len(notices) == 1 and "Bearer [the API key]" in notices[0].error
    assert key not in reply.error_message and key not in notices[0].error
    # a key the error text's truncation cut leaves nothing of its start either
    cut = {"message": "x" * (ERROR_TEXT_LIMIT - 10) + key}
    with ScriptedLLM([{"error": {"status": 401, "body": {"error": cut}}}]) as llm:
        reply = provider(llm, api, api_key=key, max_retries=0).stream("", HELLO, [])
    assert reply.error_message.endswith("x[the API key]..."), reply.error_message[-60:]
