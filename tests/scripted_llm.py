"""A real HTTP server that plays a script of LLM turns, one per request, for all of pid's tests and benchmarks.

It speaks both wire formats the providers use, streamed the way the real services stream them:
`POST /v1/chat/completions` (OpenAI SSE: role chunk, content split over chunks, tool-call fragments, finish chunk,
usage chunk with `choices: []`, `[DONE]`) and `POST /v1/messages` (Anthropic event stream).

A turn is a dict; every key is optional:
    text            the answer text, streamed in several chunks
    thinking        reasoning text (OpenAI: `reasoning_content` deltas; Anthropic: a thinking block signed
                    "sig-scripted-<request number>")
    redacted_thinking  Anthropic: a redacted_thinking block carrying this opaque data, before any thinking
    tool_calls      [{"name": ..., "arguments": {...}} | {"name": ..., "raw_arguments": "{not json"}, "id"?: ...]
    interleave      true: fragments of parallel tool calls alternate (tests assembly by index)
    finish_reason   OpenAI vocabulary (stop, length, tool_calls, content_filter), mapped for Anthropic
    usage           {"prompt_tokens", "completion_tokens", "cached_tokens"?, "cache_write_tokens"? (Anthropic's
                    cache_creation_input_tokens), "reasoning_tokens"? (OpenAI's completion_tokens_details)}; else
                    estimated from sizes
    error           {"status": 500, "body": {...}?, "headers": {...}?}: an HTTP error instead of a stream
    overflow        true (or the window, an int): a 400 refusing the request for its length, in the wire's own words
                    (OpenAI `context_length_exceeded`, Anthropic "prompt is too long")
    stream_error    "message": an error event after the first chunk, then the stream ends
    stream_error_type  Anthropic's error type for it (default overloaded_error)
    break_after     N: send the first N events, then drop the connection mid-body (a stream that breaks)
    repeat_s        S: this turn answers every request until S seconds after it first answered one (a rate limit
                    that lasts), then the script goes on
    delay_s         wait before answering at all (no headers yet)
    hold            a threading.Event: wait for the test to set it before answering (at most 120 s), after delay_s
    stall_s         send the first chunk (or `stall_after` chunks), then go silent this long before the rest
    cut             true: end the stream cleanly but without finish / [DONE] / message_stop
    raw             [str, ...]: send these SSE texts verbatim instead of a generated stream (leniency tests)
    replay          a path: send this whole HTTP response (status line, headers, body) byte for byte, as a real
                    server sent it (tests/fixtures/servers/record.py recorded it), then close the connection
    gzip            true: the stream is sent gzip-compressed (Content-Encoding: gzip), cut across its chunks
    endless         "text" | "thinking" | "arguments" | "line": a reply that never ends: deltas of that kind (a bash
                    call's arguments for "arguments"), or one data line that never ends, sent until the client
                    closes the connection (or ENDLESS_CAP bytes, so that a bug never hangs a test); `endless` then
                    holds (bytes of content sent, whether the client closed) per such reply

When the script runs out every request gets the plain answer "script exhausted", so a bug never hangs a test.
Instead of a script, a `responder(body) -> turn` can answer each request from what it carries (tests with many jobs
at once, whose requests arrive in any order); `arrived` holds each request's arrival time.

    with ScriptedLLM([{"text": "hi"}]) as llm:
        ... ProviderConfig(model="m", base_url=llm.base_url) ...
        assert llm.requests[0]["messages"][0]["role"] == "system"

Standalone, for a worker in another process: `python -m tests.scripted_llm --script turns.json [--port N]` prints its
base URL on the first line of stdout and serves until interrupted. `GET /_state` returns the requests received and
the turns left.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import signal
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

EXHAUSTED_TURN: dict[str, Any] = {"text": "script exhausted"}
ENDLESS_CAP = 128 << 20      # the most an endless reply sends
ENDLESS_PIECE = 16384        # characters per delta of an endless reply

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal"}


class ScriptedLLM:
    def __init__(self, turns: list[dict[str, Any]] | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 responder: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self._turns: deque[dict[str, Any]] = deque(turns or [])
        self.responder = responder
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self._served = 0
        self._repeat_started: dict[int, float] = {}   # id(turn) -> when a repeating turn first answered
        self.connections_opened = 0  # TCP connections accepted: tells whether clients keep connections alive
        self.requests: list[dict[str, Any]] = []       # JSON bodies, in arrival order
        self.request_headers: list[dict[str, str]] = []  # lower-cased header names, parallel to `requests`
        self.paths: list[str] = []
        self.arrived: list[float] = []                 # time.time() of each request, parallel to `requests`
        self.handling_s: list[float] = []              # how long the server took over each POST (its own latency)
        self.endless: list[tuple[int, bool]] = []      # per endless reply: (content bytes sent, client closed)
        self.endless_done = threading.Condition(self._lock)
        self._server = _Server((host, port), _Handler)
        self._server.llm = self
        self._thread: threading.Thread | None = None

    # -- script -----------------------------------------------------------------------------------------------
    @staticmethod
    def load_turns(path: str | Path) -> list[dict[str, Any]]:
        """A JSON file holding either a list of turns or {"turns": [...]}."""
        data = json.loads(Path(path).read_text())
        turns = data["turns"] if isinstance(data, dict) else data
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ValueError(f"{path}: expected a list of turn objects")
        return turns

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> "ScriptedLLM":
        return cls(cls.load_turns(path), **kwargs)

    def add(self, *turns: dict[str, Any]) -> None:
        with self._lock:
            self._turns.extend(turns)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._turns)

    def _take(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            self.paths.append(path)
            self.arrived.append(time.time())
            self._served += 1
            if self.responder is not None:
                return self.responder(body), self._served
            if not self._turns:
                return EXHAUSTED_TURN, self._served
            turn = self._turns[0]
            if turn.get("repeat_s") is None:
                return self._turns.popleft(), self._served
            now = time.monotonic()
            first = self._repeat_started.setdefault(id(turn), now)
            if now - first >= turn["repeat_s"]:
                self._turns.popleft()
                return self._take_next(), self._served
            return turn, self._served

    def _take_next(self) -> dict[str, Any]:
        """The next turn once a repeating one has run out (it may repeat in turn). Holds the lock."""
        if not self._turns:
            return EXHAUSTED_TURN
        turn = self._turns[0]
        if turn.get("repeat_s") is None:
            return self._turns.popleft()
        self._repeat_started.setdefault(id(turn), time.monotonic())
        return turn

    # -- lifecycle --------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "ScriptedLLM":
        # (how long close() waits for the server loop to notice: one poll interval, paid by every test that uses one)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.005},
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        with self._lock:
            for conn in list(self._connections):  # kept-alive connections would hold handler threads
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "ScriptedLLM":
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": list(self.requests), "paths": list(self.paths), "remaining": len(self._turns),
                    "handling_s": list(self.handling_s)}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    llm: ScriptedLLM


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, chunked streams: what the real services do
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.llm._lock:
            self.server.llm._connections.add(self.connection)
            self.server.llm.connections_opened += 1

    def finish(self) -> None:
        with self.server.llm._lock:
            self.server.llm._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, *_args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/_state":
            return self._send_json(404, {"error": {"message": f"no route {self.path}"}})
        self._send_json(200, self.server.llm.state())

    def do_POST(self) -> None:
        started = time.perf_counter()
        try:
            self._post()
        finally:
            self.server.llm.handling_s.append(time.perf_counter() - started)

    def _post(self) -> None:
        llm = self.server.llm
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        if path.endswith("/chat/completions"):
            wire = "openai"
        elif path.endswith("/messages"):
            wire = "anthropic"
        else:
            return self._send_json(404, {"error": {"message": f"no route {path}"}})
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            return self._send_json(400, {"error": {"message": f"invalid JSON body: {exc}"}})
        turn, number = llm._take(path, {k.lower(): v for k, v in self.headers.items()}, body)
        if turn.get("delay_s") and llm._closing.wait(turn["delay_s"]):
            return
        hold = turn.get("hold")
        deadline = time.monotonic() + 120
        while hold is not None and not hold.wait(0.1) and time.monotonic() < deadline:
            if llm._closing.is_set():
                return
        try:
            if "replay" in turn:
                self.close_connection = True
                self.wfile.write(Path(turn["replay"]).read_bytes())
                return self.wfile.flush()
            if turn.get("overflow"):
                return self._send_error_turn(wire, _overflow_error(wire, turn["overflow"], len(raw) // 4))
            if "error" in turn:
                return self._send_error_turn(wire, turn["error"])
            if turn.get("endless"):
                return self._stream_endless(*_endless_events(wire, turn["endless"], body, number))
            if "raw" in turn:
                events = [e.encode() for e in turn["raw"]]
            elif wire == "openai":
                events = _openai_events(turn, body, raw, number)
            else:
                events = _anthropic_events(turn, body, raw, number)
            if turn.get("break_after") is not None:
                return self._break(events, int(turn["break_after"]))
            if turn.get("gzip"):
                return self._stream_gzip(events)
            self._stream(events, turn.get("stall_s"), int(turn.get("stall_after", 1)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.end_headers()
        self.wfile.write(data)

    def _send_error_turn(self, wire: str, error: dict[str, Any]) -> None:
        status = int(error.get("status", 500))
        message = error.get("message", f"scripted error {status}")
        default = ({"error": {"message": message, "type": "server_error", "code": status}} if wire == "openai"
                   else {"type": "error", "error": {"type": "api_error", "message": message}})
        body = error.get("body", default)
        if isinstance(body, str):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (error.get("headers") or {}).items():
                self.send_header(name, str(value))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send_json(status, body, error.get("headers"))

    def _break(self, events: list[bytes], count: int) -> None:
        """Send `count` events of a chunked stream, then drop the connection without its terminating chunk."""
        self._begin_stream()
        self.wfile.write(b"".join(_chunk(e) for e in events[:count] if e))
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _begin_stream(self, encoding: str | None = None) -> None:
        """The headers of a chunked event stream (its body then goes out through _chunk)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _stream(self, events: list[bytes], stall_s: float | None, stall_after: int) -> None:
        self._begin_stream()
        chunks = [_chunk(e) for e in events if e]
        if stall_s and chunks:
            self.wfile.write(b"".join(chunks[:stall_after]))
            chunks = chunks[stall_after:]
            if self.server.llm._closing.wait(stall_s):
                self.close_connection = True
                return
        self.wfile.write(b"".join(chunks) + b"0\r\n\r\n")

    def _stream_endless(self, opening: bytes, piece: bytes, size: int) -> None:
        """`opening`, then `piece` (`size` bytes of content) again and again until the client hangs up; what was
        sent is recorded in the server's `endless`."""
        llm = self.server.llm
        self._begin_stream()
        sent, closed = 0, False
        try:
            self.wfile.write(_chunk(opening))
            chunk = _chunk(piece)
            while sent < ENDLESS_CAP and not llm._closing.is_set():
                self.wfile.write(chunk)
                sent += size
        except OSError:   # (BrokenPipeError, ConnectionResetError): the client went away
            closed = True
        finally:
            self.close_connection = True
            with llm.endless_done:
                llm.endless.append((sent, closed))
                llm.endless_done.notify_all()

    def _stream_gzip(self, events: list[bytes]) -> None:
        """The events gzip-compressed, the compressed bytes sent in chunks that cut across events."""
        self._begin_stream("gzip")
        packed = gzip.compress(b"".join(events))
        self.wfile.write(b"".join(_chunk(packed[i:i + 7]) for i in range(0, len(packed), 7)) + b"0\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    """One chunk of a chunked HTTP body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


# -- wire formats ---------------------------------------------------------------------------------------------

def _overflow_error(wire: str, window: Any, tokens: int) -> dict[str, Any]:
    """A refusal for length as each service words it (the body the real APIs send with their 400)."""
    limit = window if isinstance(window, int) and not isinstance(window, bool) else 32768
    tokens = max(tokens, limit + 1)
    if wire == "openai":
        return {"status": 400, "body": {"error": {
            "message": f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
                       f"{tokens} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}}
    return {"status": 400, "body": {"type": "error", "error": {
        "type": "invalid_request_error", "message": f"prompt is too long: {tokens} tokens > {limit} maximum"}}}


def _pieces(text: str, count: int) -> list[str]:
    """`text` cut into up to `count` consecutive pieces of near-equal length."""
    if not text:
        return []
    size = math.ceil(len(text) / max(1, min(count, len(text))))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _text_pieces(text: str) -> list[str]:
    return _pieces(text, min(8, max(1, len(text) // 4)))


def _arguments_text(call: dict[str, Any]) -> str:
    return call["raw_arguments"] if "raw_arguments" in call else json.dumps(call.get("arguments", {}))


def _usage(turn: dict[str, Any], raw_request: bytes) -> tuple[int, int, int]:
    """(prompt tokens including cached, completion tokens, cached tokens). The extra counts (cache writes,
    reasoning) are read where they are sent."""
    given = turn.get("usage") or {}
    produced = len(turn.get("text", "")) + len(turn.get("thinking", "")) + sum(
        len(_arguments_text(c)) for c in turn.get("tool_calls", []))
    return (int(given.get("prompt_tokens", len(raw_request) // 4)),
            int(given.get("completion_tokens", produced // 4 + 1)),
            int(given.get("cached_tokens", 0)))


def _tool_fragments(calls: list[dict[str, Any]], interleave: bool, id_prefix: str) -> list[tuple[int, dict[str, Any]]]:
    """(call index, fragment) in stream order: a head (id, name) per call, then its argument pieces."""
    per_call = []
    for i, call in enumerate(calls):
        head = {"id": call.get("id") or f"{id_prefix}{i}", "name": call["name"]}
        per_call.append([(i, head)] + [(i, {"arguments": p}) for p in _pieces(_arguments_text(call), 4)])
    if not interleave:
        return [f for fragments in per_call for f in fragments]
    order: list[tuple[int, dict[str, Any]]] = []
    for step in range(max((len(f) for f in per_call), default=0)):
        order += [fragments[step] for fragments in per_call if step < len(fragments)]
    return order


def _openai_events(turn: dict[str, Any], request: dict[str, Any], raw: bytes, number: int) -> list[bytes]:
    chunk_id, created, model = f"chatcmpl-scripted{number}", int(time.time()), request.get("model", "scripted")
    with_usage = bool((request.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload: dict[str, Any] = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                   "model": model, "system_fingerprint": "fp_scripted",
                                   "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                "finish_reason": finish}]}
        if with_usage:
            payload["usage"] = None
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if turn.get("stream_error"):
        return events + [b"data: " + json.dumps({"error": {"message": turn["stream_error"], "code": 502}}).encode()
                         + b"\n\n"]
    events += [chunk({"reasoning_content": p}) for p in _text_pieces(turn.get("thinking", ""))]
    events += [chunk({"content": p}) for p in _text_pieces(turn.get("text", ""))]
    calls = turn.get("tool_calls", [])
    for index, fragment in _tool_fragments(calls, bool(turn.get("interleave")), f"call_{number}_"):
        if "name" in fragment:
            delta = {"index": index, "id": fragment["id"], "type": "function",
                     "function": {"name": fragment["name"], "arguments": ""}}
        else:
            delta = {"index": index, "function": {"arguments": fragment["arguments"]}}
        events.append(chunk({"tool_calls": [delta]}))
    if turn.get("cut"):
        return events
    events.append(chunk({}, turn.get("finish_reason") or ("tool_calls" if calls else "stop")))
    if with_usage:
        prompt, completion, cached = _usage(turn, raw)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": int((turn.get("usage") or {}).get(
                     "reasoning_tokens", 0)), "audio_tokens": 0}}
        events.append(b"data: " + json.dumps({"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                              "model": model, "system_fingerprint": "fp_scripted", "choices": [],
                                              "usage": usage}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _anthropic_events(turn: dict[str, Any], request: dict[str, Any], raw: bytes, number: int) -> list[bytes]:
    def event(name: str, payload: dict[str, Any]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + json.dumps(payload).encode() + b"\n\n"

    prompt, completion, cached = _usage(turn, raw)
    written = int((turn.get("usage") or {}).get("cache_write_tokens", 0))
    events = [event("message_start", {"type": "message_start", "message": {
        "id": f"msg_scripted{number}", "type": "message", "role": "assistant",
        "model": request.get("model", "scripted"), "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": max(prompt - cached - written, 0), "cache_creation_input_tokens": written,
                  "cache_read_input_tokens": cached, "output_tokens": 1}}})]
    if turn.get("stream_error"):
        return events + [event("error", {"type": "error", "error": {
            "type": turn.get("stream_error_type", "overloaded_error"), "message": turn["stream_error"]}})]
    events.append(event("ping", {"type": "ping"}))
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        events.append(event("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": start}))
        events.extend(event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                      for d in deltas)
        events.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if turn.get("redacted_thinking"):
        block({"type": "redacted_thinking", "data": turn["redacted_thinking"]}, [])
    if turn.get("thinking"):
        block({"type": "thinking", "thinking": ""},
              [{"type": "thinking_delta", "thinking": p} for p in _text_pieces(turn["thinking"])]
              + [{"type": "signature_delta", "signature": f"sig-scripted-{number}"}])
    if turn.get("text"):
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in _text_pieces(turn["text"])])
    calls = turn.get("tool_calls", [])
    for i, call in enumerate(calls):
        block({"type": "tool_use", "id": call.get("id") or f"toolu_scripted{number}_{i}", "name": call["name"],
               "input": {}},
              [{"type": "input_json_delta", "partial_json": ""}]
              + [{"type": "input_json_delta", "partial_json": p} for p in _pieces(_arguments_text(call), 4)])
    if turn.get("cut"):
        return events
    finish = turn.get("finish_reason") or ("tool_calls" if calls else "stop")
    events.append(event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": _ANTHROPIC_STOP.get(finish, finish),
                                                    "stop_sequence": None},
                                          "usage": {"output_tokens": completion}}))
    events.append(event("message_stop", {"type": "message_stop"}))
    return events


def _endless_events(wire: str, kind: str, request: dict[str, Any], number: int) -> tuple[bytes, bytes, int]:
    """(the stream's opening, one piece to repeat after it, the piece's content bytes) of an endless reply."""
    text = "x" * ENDLESS_PIECE
    model = request.get("model", "scripted")
    if wire == "openai":
        def chunk(delta: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps({"id": f"chatcmpl-endless{number}", "object": "chat.completion.chunk",
                                           "model": model, "choices": [{"index": 0, "delta": delta}]}).encode() + \
                b"\n\n"

        opening = chunk({"role": "assistant", "content": ""})
        if kind == "arguments":
            opening += chunk({"tool_calls": [{"index": 0, "id": "call_endless", "type": "function",
                                              "function": {"name": "bash", "arguments": '{"command": "'}}]})
            return opening, chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}), len(text)
        if kind == "line":
            return opening + b'data: {"choices": [{"index": 0, "delta": {"content": "', text.encode(), len(text)
        field = {"text": "content", "thinking": "reasoning_content"}[kind]
        return opening, chunk({field: text}), len(text)

    def event(payload: dict[str, Any]) -> bytes:
        return b"event: " + payload["type"].encode() + b"\ndata: " + json.dumps(payload).encode() + b"\n\n"

    opening = event({"type": "message_start", "message": {
        "id": f"msg_endless{number}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 1}}})
    block = {"text": {"type": "text", "text": ""}, "line": {"type": "text", "text": ""},
             "thinking": {"type": "thinking", "thinking": ""},
             "arguments": {"type": "tool_use", "id": "toolu_endless", "name": "bash", "input": {}}}[kind]
    opening += event({"type": "content_block_start", "index": 0, "content_block": block})
    if kind == "line":
        return opening + (b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
                          b'"delta": {"type": "text_delta", "text": "'), text.encode(), len(text)
    delta = {"text": {"type": "text_delta", "text": text}, "thinking": {"type": "thinking_delta", "thinking": text},
             "arguments": {"type": "input_json_delta", "partial_json": text}}[kind]
    if kind == "arguments":
        opening += event({"type": "content_block_delta", "index": 0,
                          "delta": {"type": "input_json_delta", "partial_json": '{"command": "'}})
    return opening, event({"type": "content_block_delta", "index": 0, "delta": delta}), len(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a script of LLM turns over OpenAI and Anthropic wire formats.")
    parser.add_argument("--script", required=True, help="JSON file: a list of turns or {\"turns\": [...]}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    llm = ScriptedLLM.from_file(args.script, host=args.host, port=args.port).start()
    host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    serve_until_signalled(llm, f"http://{host}:{llm.port}/v1")


def serve_until_signalled(llm: ScriptedLLM, banner: str) -> None:
    """A started server, as a process of its own: `banner` printed, served until SIGTERM or SIGINT, then closed."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(banner, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        llm.close()


if __name__ == "__main__":
    main()
