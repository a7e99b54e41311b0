"""pid against a real OpenAI-compatible server nobody here wrote: llama.cpp's own `llama-server`, built offline from
the llama-cpp-python sdist with the Gemma 3 270M GGUF from PyPI (docker/build-llama.sh; its cache lives outside the
clone). The model is a base model with no chat template: what it says is noise, so these tests look at the protocol
(streams, usage, finish reasons, a real context overflow, cancel), never at the words.

Tier `llama`: `docker/setup.sh --test` builds the cache where it can (~11 min the first time) and runs it; without
the cache every test here skips, saying so.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

import pytest

from pid.agent import Agent, Limits
from pid.compaction import Compactor
from pid.messages import AssistantMessage, ToolResultMessage, UserMessage
from pid.providers import ProviderConfig, make_provider
from pid.providers.overflow import is_context_overflow
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import MemorySandbox, Run
from tests.services import missing

pytestmark = pytest.mark.llama

CACHE = Path(os.environ.get("PID_LLAMA_CACHE", "/var/cache/pid-llama")) / "0.3.36"
SERVER, MODEL = CACHE / "bin" / "llama-server", CACHE / "gemma3-270m-q4_k_m.gguf"
PYSERVER = CACHE / "pyserver" / "bin" / "python"   # llama-cpp-python's own server, same sdist
CONTEXT = 8192   # tokens: room for the compaction test; a real overflow is still cheap to cause


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(command: list[str], ready_path: str, port: int):
    """Run a server until the module is done; its base URL once `ready_path` answers 200."""
    log = open(CACHE.parent / f"server-{port}.log", "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not start (see {log.name})")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server() -> str:
    """A llama-server on a free loopback port for this module; its base URL."""
    if not (SERVER.is_file() and MODEL.is_file()):
        missing(f"no llama-server build in {CACHE} (bash docker/build-llama.sh makes it)")
    port = _free_port()
    yield from _serve([str(SERVER), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                       "-c", str(CONTEXT), "-n", "256", "--threads", "2", "--parallel", "1"], "/health", port)


@pytest.fixture(scope="module")
def python_server() -> str:
    """llama-cpp-python's server with its function-calling chat format; its base URL."""
    if not (PYSERVER.is_file() and MODEL.is_file()):
        missing(f"no llama-cpp-python server build in {CACHE} (bash docker/build-llama.sh makes it)")
    port = _free_port()
    yield from _serve([str(PYSERVER), "-m", "llama_cpp.server", "--model", str(MODEL), "--host", "127.0.0.1",
                       "--port", str(port), "--n_ctx", "2048", "--n_threads", "2",
                       "--chat_format", "chatml-function-calling"], "/v1/models", port)


def _provider(base_url: str, **settings):
    return make_provider(ProviderConfig(model="gemma3-270m", base_url=base_url, api="openai-completions",
                                        provider="llama.cpp", max_retries=0, **settings))


def test_a_real_stream_is_read_with_the_server_s_own_usage(server):
    provider = _provider(server, max_tokens=24)
    try:
        deltas: list[str] = []
        reply = provider.stream("You are terse.", [UserMessage.text("Say hello.")], [], on_text=deltas.append)
    finally:
        provider.close()
    assert reply.stop_reason in ("stop", "length"), reply.error_message
    assert reply.usage.input > 5 and 0 < reply.usage.output <= 24 and not reply.usage.estimated
    assert "".join(deltas) == reply.text


def test_an_answer_cut_at_the_output_limit_ends_the_job_as_length(server):
    """The server stops at max_tokens with finish_reason length: the job ends `length` (a limit), not completed."""
    provider = _provider(server, max_tokens=4)
    try:
        agent = Agent(provider, default_registry(), ToolContext(sandbox=MemorySandbox()), "You are terse.",
                      limits=Limits(max_turns=3))
        outcome = agent.run("Write a long story about a lighthouse keeper.")
    finally:
        provider.close()
    assert (outcome.exit_reason, outcome.status) == ("length", "limit"), outcome.error
    assert outcome.usage.output == 4 and not outcome.usage.estimated


def test_a_real_context_overflow_is_recognised(server):
    provider = _provider(server, max_tokens=8)
    try:
        reply = provider.stream("", [UserMessage.text("lighthouse keeper " * (CONTEXT * 2))], [])
    finally:
        provider.close()
    assert reply.stop_reason == "error" and is_context_overflow(reply), reply.error_message
    assert "HTTP 400" in (reply.error_message or "")


def test_a_cancel_ends_a_real_stream_before_the_server_is_done(server):
    """Cancelled at its first text: the reply ends aborted with a few tokens, not the 256 the server would stream (at
    this VM's ~15 tokens/s, many seconds more). How fast it ends is bench/'s business, not this test's."""
    provider = _provider(server, max_tokens=256)
    cancel = threading.Event()
    deltas: list[str] = []

    def on_text(text: str) -> None:
        deltas.append(text)
        cancel.set()
    try:
        reply = provider.stream("", [UserMessage.text("Count from one to two hundred.")], [], on_text=on_text,
                                cancel=cancel)
    finally:
        provider.close()
    assert deltas, reply.error_message
    assert reply.stop_reason == "aborted" and len(deltas) < 32


def test_a_long_conversation_is_compacted_by_the_real_server(server):
    """pid believes the window is 4096 tokens (the server has more): the second task does not fit with the first, so
    the first is summarised by the real server, and the conversation goes on from that summary."""
    provider = _provider(server, max_tokens=32)
    compactor = Compactor(provider, 4096, max_output_tokens=32)
    try:
        agent = Agent(provider, default_registry(), ToolContext(sandbox=MemorySandbox()), "You are terse.",
                      limits=Limits(max_turns=3), compactor=compactor)
        first = agent.run("Tell me about a lighthouse keeper. " + "lighthouse keeper " * 250)
        assert first.exit_reason in ("stop", "length") and compactor.latest is None, first.error
        second = agent.run("Now tell me about a harbour pilot. " + "harbour pilot " * 250)
    finally:
        provider.close()
    assert second.exit_reason in ("stop", "length"), second.error
    summary = compactor.latest
    assert summary is not None and summary.summary.strip() and summary.summarized >= 2
    assert summary.usage.input > 0 and summary.usage.output > 0 and not summary.usage.estimated   # the server's
    assert summary.first_kept >= 2   # the first task and its answer are in the summary only


class ForcingProxy(ThreadingHTTPServer):
    """Between pid and the server: the first request's `tool_choice` becomes one naming `tool` (the server's own
    way to force a call: a grammar, made from the tool's schema), later ones "none" (so the base model answers in
    words). Keeps each request as the server got it and each response body as the server sent it."""

    def __init__(self, upstream: str, tool: str) -> None:
        self.upstream, self.tool = upstream, tool
        self.asked: list[Any] = []   # the tool_choice pid sent, before the proxy's
        self.sent: list[dict[str, Any]] = []
        self.streamed: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _ForcingHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _ForcingHandler(BaseHTTPRequestHandler):
    server: ForcingProxy

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "tools" in body:
            self.server.asked.append(body.get("tool_choice"))
            body["tool_choice"] = ({"type": "function", "function": {"name": self.server.tool}}
                                   if not self.server.sent else "none")
            for tool in body["tools"]:   # (its required arguments only: the noise a base model puts in the optional
                schema = tool["function"]["parameters"]   # ones, such as a timeout of 2e15 s, fails pid's check)
                schema["properties"] = {k: v for k, v in schema["properties"].items() if k in schema["required"]}
        self.server.sent.append(body)
        with httpx.stream("POST", self.server.upstream + self.path.removeprefix("/v1"), json=body,
                          timeout=120) as answer:
            data = answer.read()
        self.server.streamed.append(data)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "text/event-stream"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _streamed_calls(data: bytes) -> list[tuple[str, str]]:
    """(name, arguments) of each tool call in a recorded stream, from `tool_calls` alone."""
    calls: dict[int, list[str]] = {}
    for line in data.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            for fragment in (choice.get("delta") or {}).get("tool_calls") or []:
                parts = calls.setdefault(fragment["index"], ["", ""])
                function = fragment.get("function") or {}
                parts[0] = parts[0] or function.get("name") or ""
                parts[1] += function.get("arguments") or ""
    return [(name, arguments) for name, arguments in calls.values()]


def test_a_tool_call_the_server_streams_runs_and_its_result_goes_back(python_server):
    """The base model makes no tool call by itself: the server is made to (tool_choice naming bash, a grammar on its
    side). What it streamed (function_call and tool_calls, each fragment twice) is read once; the call runs, and the
    next request carries the call and its result back in a form the server takes."""
    proxy = ForcingProxy(python_server, "bash")
    provider = _provider(proxy.base_url, max_tokens=48)
    box = MemorySandbox(lambda command, sandbox: Run("file_name.txt\n"))
    try:
        agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "You are terse.",
                      limits=Limits(max_turns=3))
        outcome = agent.run("List the files.")
    finally:
        provider.close()
        proxy.shutdown()
        proxy.server_close()
    streamed = _streamed_calls(proxy.streamed[0])
    assert [name for name, _ in streamed] == ["bash"], proxy.streamed[0][:500]   # the server's call, not pid's
    call = next(m for m in agent.messages if isinstance(m, AssistantMessage) and m.tool_calls).tool_calls[0]
    assert (call.name, call.arguments) == ("bash", json.loads(streamed[0][1], strict=False))   # (raw newlines too)
    assert box.commands == [call.arguments["command"]]
    result = next(m for m in agent.messages if isinstance(m, ToolResultMessage))
    assert result.tool_call_id == call.id and not result.is_error
    back = proxy.sent[1]["messages"]
    assert back[-2]["tool_calls"][0]["id"] == call.id and back[-2]["content"] == ""
    assert back[-1]["role"] == "tool" and back[-1]["tool_call_id"] == call.id
    assert outcome.exit_reason in ("stop", "length") and proxy.streamed[1].strip(), outcome.error
    assert proxy.asked == ["auto", "auto"]   # pid's own: without it this server drops the tools
    assert outcome.usage.estimated           # (this server reports no usage: pid's count, and it says so)
