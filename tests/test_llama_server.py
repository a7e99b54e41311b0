"""pid against a real OpenAI-compatible server nobody here wrote: llama.cpp's own `llama-server`, built offline from
the llama-cpp-python sdist with the Gemma 3 270M GGUF from PyPI (docker/build-llama.sh; its cache lives outside the
clone). The model is a base model with no chat template: what it says is noise, so these tests look at the protocol
(streams, usage, finish reasons, a real context overflow, cancel), never at the words.

Tier `llama`: `docker/setup.sh --test` builds the cache where it can (~11 min the first time) and runs it; without
the cache every test here skips, saying so.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pid.agent import Agent, Limits
from pid.compaction import Compactor
from pid.messages import UserMessage
from pid.providers import ProviderConfig, make_provider
from pid.providers.overflow import is_context_overflow
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import MemorySandbox

pytestmark = pytest.mark.llama

CACHE = Path(os.environ.get("PID_LLAMA_CACHE", "/var/cache/pid-llama")) / "0.3.36"
SERVER, MODEL = CACHE / "bin" / "llama-server", CACHE / "gemma3-270m-q4_k_m.gguf"
CONTEXT = 8192   # tokens: room for the compaction test; a real overflow is still cheap to cause


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> str:
    """A llama-server on a free loopback port for this module; its base URL."""
    if not (SERVER.is_file() and MODEL.is_file()):
        pytest.skip(f"no llama-server build in {CACHE} (bash docker/build-llama.sh makes it)")
    port = _free_port()
    log = open(CACHE.parent / f"server-{port}.log", "wb")
    proc = subprocess.Popen([str(SERVER), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                             "-c", str(CONTEXT), "-n", "256", "--threads", "2", "--parallel", "1"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start (see {log.name})")
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
        assert first.exit_reason in ("completed", "length") and compactor.latest is None, first.error
        second = agent.run("Now tell me about a harbour pilot. " + "harbour pilot " * 250)
    finally:
        provider.close()
    assert second.exit_reason in ("completed", "length"), second.error
    summary = compactor.latest
    assert summary is not None and summary.summary.strip() and summary.summarized >= 2
    assert summary.usage.input > 0 and summary.usage.output > 0 and not summary.usage.estimated   # the server's
    assert summary.first_kept >= 2   # the first task and its answer are in the summary only
