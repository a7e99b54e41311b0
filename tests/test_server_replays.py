"""Real model servers' answers, replayed byte for byte: the bugs pid had against servers nobody here wrote stay
fixed without those servers.

tests/fixtures/servers/<server>/*.response are whole HTTP responses (status line, headers, chunk framing, body) as
the server sent them to pid, recorded by tests/fixtures/servers/record.py on 2026-12-01:
- `llama-server/`: llama.cpp's C++ server as built by docker/build-llama.sh (llama-cpp-python 0.3.36's vendored
  llama.cpp), serving Gemma 3 270M (a base model: its words are noise);
- `llama-cpp-python/`: `python -m llama_cpp.server` 0.3.36 (`--chat_format chatml-function-calling`), same model.
Ollama and vLLM cannot be installed here: their streams at the end are written from their source, and say so.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pid.agent import Agent, Limits
from pid.messages import ThinkingContent, UserMessage
from pid.providers import ProviderConfig, make_provider
from pid.providers.overflow import is_context_overflow
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import MemorySandbox
from tests.scripted_llm import ScriptedLLM

FIXTURES = Path(__file__).parent / "fixtures" / "servers"


def replay(name: str) -> dict[str, str]:
    return {"replay": str(FIXTURES / name)}


def provider_for(llm: ScriptedLLM, **settings):
    return make_provider(ProviderConfig(model="gemma3-270m", base_url=llm.base_url, provider="llama.cpp",
                                        **{"max_retries": 0, **settings}))


def run_agent(llm: ScriptedLLM, task: str = "Write a long story about a lighthouse keeper.", **settings):
    provider = provider_for(llm, **settings)
    try:
        agent = Agent(provider, default_registry(), ToolContext(sandbox=MemorySandbox()), "You are terse.",
                      limits=Limits(max_turns=3))
        return agent, agent.run(task)
    finally:
        provider.close()


# -- llama.cpp's llama-server ----------------------------------------------------------------------------------------
def test_llama_server_s_answer_cut_at_its_output_limit_ends_the_job_as_length():
    """It used to end `completed (stop)`: a turn cut at the output limit is not a finished job."""
    with ScriptedLLM([replay("llama-server/length.response")]) as llm:
        agent, outcome = run_agent(llm, max_tokens=6)
    assert (outcome.exit_reason, outcome.status) == ("length", "limit"), outcome.error
    reply = agent.messages[-1]
    assert reply.text == "Write a story about a lighthouse" and reply.stop_reason == "length"
    # the usage-only last chunk (with llama.cpp's `timings` beside it) is the server's count, not an estimate
    assert (outcome.usage.input, outcome.usage.output, outcome.usage.estimated) == (50, 6, False)


def test_llama_server_s_context_overflow_is_recognised():
    with ScriptedLLM([replay("llama-server/overflow.response")]) as llm:
        provider = provider_for(llm, max_tokens=8)
        try:
            reply = provider.stream("", [UserMessage.text("lighthouse keeper " * 1500)], [])
        finally:
            provider.close()
    assert reply.stop_reason == "error" and is_context_overflow(reply), reply.error_message
    assert "exceeds the available context size (1024 tokens)" in (reply.error_message or "")


# -- llama-cpp-python's server -----------------------------------------------------------------------------------------
def test_llama_cpp_python_s_arguments_sent_twice_in_one_delta_are_read_once():
    """Each fragment comes both in the legacy `function_call` and in `tool_calls`, in the same delta: pid used to
    append both (`{"{"commandcommand…`) and refuse the call as invalid JSON. Recorded with pid's request but for
    `tool_choice` naming bash: the base model calls nothing by itself, and this server streams no automatic tool
    call ("Automatic streaming tool choice is not supported": it answers an empty stream, as below)."""
    with ScriptedLLM([replay("llama-cpp-python/doubled-arguments.response")]) as llm:
        provider = provider_for(llm, max_tokens=48)
        try:
            reply = provider.stream("You are terse.", [UserMessage.text("List the files.")],
                                    [s for s in default_registry().specs() if s.name == "bash"])
        finally:
            provider.close()
    assert reply.stop_reason == "toolUse", reply.error_message
    assert [(c.name, c.arguments, c.raw_arguments) for c in reply.tool_calls] == [
        ("bash", {"command": "bash -c 'file_name.txt'", "timeout": 120}, None)]
    assert reply.tool_calls[0].id == "call__0_bash_cmpl-fe3ebdf5-ddc4-4ead-97e9-31106eb1ad0f"
    assert (reply.usage.input, reply.usage.output) == (0, 0)   # (it sends no usage: the loop estimates it)


def test_llama_cpp_python_s_empty_stream_ends_the_job_saying_so_after_a_few_tries():
    """Its answer to a prompt past the context, streamed: HTTP 200 and not one event. pid used to retry it as a
    broken stream for its whole retry budget (20 attempts, 300 s) and end `limit/wall_clock` without a word."""
    empty = replay("llama-cpp-python/empty-stream.response")
    with ScriptedLLM([empty] * 10) as llm:
        _, outcome = run_agent(llm, "lighthouse keeper " * 1500, max_retries=None, retry_base_s=0.01)
        asked = len(llm.requests)
    assert outcome.status == "failed" and "the server returned an empty response" in (outcome.error or ""), outcome
    assert asked <= 3


def test_a_tool_call_goes_back_to_llama_cpp_python_in_a_form_it_takes():
    """Replayed by what each request carries, as the server answered it: an assistant tool call sent back with
    `"content": null` gets its HTTP 500 (pid sent that), one with no content its empty stream (its template fails;
    pid sent that next), one with `"content": ""` an answer."""
    def server(body: dict[str, Any]) -> dict[str, Any]:
        calls = [m for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
        if not calls:
            return {"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
        if "content" not in calls[0]:
            return replay("llama-cpp-python/content-missing.response")
        if calls[0]["content"] is None:
            return replay("llama-cpp-python/content-null.response")
        return {"text": "README.md is there."}

    with ScriptedLLM(responder=server) as llm:
        agent, outcome = run_agent(llm, "List the files.")
    assert (outcome.status, agent.messages[-1].text) == ("completed", "README.md is there."), outcome.error


# -- servers not installable here: written from their source, not recorded ------------------------------------------
def _chunks(base: dict[str, Any], *parts: dict[str, Any]) -> list[str]:
    return [f"data: {json.dumps({**base, **part})}\n\n" for part in parts] + ["data: [DONE]\n\n"]


def _stream_with_tools(turn: dict[str, Any]):
    with ScriptedLLM([turn]) as llm:
        provider = provider_for(llm)
        try:
            return provider.stream("system", [UserMessage.text("look around")], default_registry().specs())
        finally:
            provider.close()


def test_ollama_s_whole_tool_calls_all_at_index_0_and_its_reasoning_field():
    """Ollama's OpenAI layer (ollama/ollama openai/openai.go, ToChunk and ToToolCalls) repeats `role` in every delta,
    sends `content: ""` beside tool calls, sends each call whole in one delta with the index its parser gave (0 for
    every call of a parallel batch: the ids tell them apart), names its thinking `reasoning`, ends with
    finish_reason tool_calls, and sends usage in a chunk of its own, with `choices: []`, when include_usage is asked."""
    base = {"id": "chatcmpl-512", "object": "chat.completion.chunk", "created": 1764547200, "model": "qwen3:8b",
            "system_fingerprint": "fp_ollama"}

    def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", **d}, "finish_reason": finish}]}

    turn = {"raw": _chunks(
        base,
        delta({"reasoning": "I should list the files"}),
        delta({"reasoning": " and read the README."}),
        delta({"tool_calls": [{"id": "call_ux1jb1", "index": 0, "type": "function",
                               "function": {"name": "bash", "arguments": "{\"command\":\"ls -la\"}"}}]}),
        delta({"tool_calls": [{"id": "call_m2k9qd", "index": 0, "type": "function",
                               "function": {"name": "read", "arguments": "{\"path\":\"README.md\"}"}}]}),
        delta({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 412, "completion_tokens": 38, "total_tokens": 450}})}
    reply = _stream_with_tools(turn)
    assert reply.stop_reason == "toolUse", reply.error_message
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_ux1jb1", "bash", {"command": "ls -la"}), ("call_m2k9qd", "read", {"path": "README.md"})]
    thinking = [c for c in reply.content if isinstance(c, ThinkingContent)]
    assert [t.thinking for t in thinking] == ["I should list the files and read the README."]
    assert (reply.usage.input, reply.usage.output, reply.usage.estimated) == (412, 38, False)


def test_vllm_s_tool_call_streamed_in_fragments_after_its_name():
    """vLLM's tool parsers (vllm/entrypoints/openai/protocol.py DeltaToolCall, serving_chat.py) send the call's id,
    type and name first, with no arguments, then the arguments in fragments carrying only the index; `content: ""`
    opens the stream, finish_reason is tool_calls (beside vLLM's own `stop_reason: null`), and usage comes last in a
    chunk with `choices: []`."""
    base = {"id": "chatcmpl-5f0c", "object": "chat.completion.chunk", "created": 1764547200,
            "model": "Qwen/Qwen2.5-7B-Instruct"}

    def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish,
                             **({"stop_reason": None} if finish else {})}]}

    def arguments(fragment: str) -> dict[str, Any]:
        return delta({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})

    turn = {"raw": _chunks(
        base,
        delta({"role": "assistant", "content": ""}),
        delta({"tool_calls": [{"id": "chatcmpl-tool-8d1e", "type": "function", "index": 0,
                               "function": {"name": "edit"}}]}),
        arguments('{"path": "a.py", "edits": [{"old'),
        arguments('Text": "x = 1", "newText": "x = 2"}]}'),
        delta({"content": ""}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 300, "total_tokens": 325, "completion_tokens": 25}})}
    reply = _stream_with_tools(turn)
    assert reply.stop_reason == "toolUse", reply.error_message
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("chatcmpl-tool-8d1e", "edit", {"path": "a.py", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]})]
    assert reply.text == "" and (reply.usage.input, reply.usage.output, reply.usage.estimated) == (300, 25, False)
