"""Thinking models and prompt caching against the scripted server: --thinking maps to each API's reasoning setting,
thinking blocks go back as each API requires (Anthropic: unchanged, with their signatures), the session records them
as pi does, reasoning tokens are counted, and Anthropic's cache marks and both APIs' cache tokens are priced."""
from __future__ import annotations

import json

import pytest

from pid import events as ev
from pid.agent import Agent
from pid.messages import AssistantMessage, TextContent, ThinkingContent, UserMessage
from pid.providers import make_provider
from pid.providers.anthropic import thinking_tokens
from pid.providers.base import ProviderConfig
from pid.session import SessionWriter
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import Commands, MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM

OPENAI = "openai-completions"
ANTHROPIC = "anthropic-messages"
HELLO = [UserMessage.text("hello")]


def provider(llm: ScriptedLLM, api: str = OPENAI, model: str = "m", **overrides):
    return make_provider(ProviderConfig(model=model, base_url=llm.base_url, api=api, provider="scripted",
                                        max_retries=0, **overrides))


# -- OpenAI-compatible -------------------------------------------------------------------------------------------

def test_openai_thinking_level_is_reasoning_effort():
    with ScriptedLLM([{"text": "a"}, {"text": "b"}]) as llm:
        provider(llm, thinking="medium").stream("", HELLO, [])
        provider(llm).stream("", HELLO, [])
    assert llm.requests[0]["reasoning_effort"] == "medium"
    assert "reasoning_effort" not in llm.requests[1]


def test_openai_reasoning_content_is_kept_counted_and_sent_back_in_its_field():
    script = [{"thinking": "Think first.", "text": "Answer.",
               "usage": {"prompt_tokens": 100, "completion_tokens": 40, "reasoning_tokens": 25}}, {"text": "ok"}]
    with ScriptedLLM(script) as llm:
        p = provider(llm, thinking="high")
        reply = p.stream("", HELLO, [])
        assert reply.content[0] == ThinkingContent("Think first.", "reasoning_content")
        assert (reply.usage.output, reply.usage.reasoning) == (40, 25)   # reasoning is part of the output
        assert reply.usage.to_result()["reasoning"] == 25
        p.stream("", HELLO + [reply, UserMessage.text("more")], [])
    sent = llm.requests[1]["messages"][1]
    assert sent == {"role": "assistant", "content": "Answer.", "reasoning_content": "Think first."}


def test_openai_reasoning_from_another_model_becomes_text():
    other = AssistantMessage([ThinkingContent("Old thoughts.", "sig"), TextContent("Old answer.")],
                             ANTHROPIC, "x", "claude")
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm).stream("", HELLO + [other, UserMessage.text("go on")], [])
    assert llm.requests[0]["messages"][1] == {"role": "assistant", "content": "Old thoughts.Old answer."}


def test_openai_cached_tokens_are_priced():
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 600}
    with ScriptedLLM([{"text": "ok", "usage": usage}]) as llm:
        reply = provider(llm, input_cost_per_mtok=2, output_cost_per_mtok=8, cache_read_cost_per_mtok=0.5
                         ).stream("", HELLO, [])
    assert (reply.usage.input, reply.usage.cache_read) == (400, 600)
    assert reply.usage.cost.total == pytest.approx((400 * 2 + 100 * 8 + 600 * 0.5) / 1e6)


# -- Anthropic ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, budget", [("low", 2048), ("medium", 8192), ("high", 16384)])
def test_anthropic_thinking_has_pis_budgets_and_max_tokens_above_them(level, budget):
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC, thinking=level, temperature=0.5).stream("", HELLO, [])
        body, headers = llm.requests[0], llm.request_headers[0]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == 8192 + budget
    assert "temperature" not in body                        # the API refuses one with thinking on
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_anthropic_thinking_fits_the_models_output_ceiling():
    assert thinking_tokens("medium", 8192, 10000) == (10000, 8192)
    assert thinking_tokens("high", 8192, 16000) == (16000, 16000 - 1024)   # max_tokens must exceed the budget
    assert thinking_tokens("low", 4096, None) == (4096 + 2048, 2048)


def test_anthropic_thinking_off_sends_no_thinking():
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC, temperature=0.5).stream("", HELLO, [])
        body, headers = llm.requests[0], llm.request_headers[0]
    assert "thinking" not in body and body["temperature"] == 0.5 and "anthropic-beta" not in headers


def test_anthropic_46_models_think_adaptively():
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC, model="claude-sonnet-4-6", thinking="high").stream("", HELLO, [])
        body = llm.requests[0]
    assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {"effort": "high"}
    assert body["max_tokens"] == 8192


def test_anthropic_thinking_signatures_go_back_unchanged_and_the_session_records_them_as_pi(tmp_path):
    """The acceptance case, through the agent: a thinking turn with a tool call, then the next request."""
    script = [{"redacted_thinking": "opaque-REDACTED-data==", "thinking": "I should list the files.",
               "text": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
              {"thinking": "Done now.", "text": "All done.",
               "usage": {"prompt_tokens": 2000, "completion_tokens": 50, "cached_tokens": 1200,
                         "cache_write_tokens": 300}}]
    events: list[ev.Event] = []
    with ScriptedLLM(script) as llm, MemorySandbox(Commands({"true": Run()})) as box:
        p = provider(llm, ANTHROPIC, thinking="low", input_cost_per_mtok=3, output_cost_per_mtok=15,
                     cache_read_cost_per_mtok=0.3, cache_write_cost_per_mtok=3.75)
        with SessionWriter(str(tmp_path / "session.jsonl")) as session:
            outcome = Agent(p, default_registry(), ToolContext(sandbox=box), "SYSTEM", sink=events.append,
                            session=session).run("list the files")
        first, second = llm.requests
    assert outcome.status == "completed" and outcome.final_message == "All done."
    sent = second["messages"][1]
    assert sent["role"] == "assistant"
    assert sent["content"][:3] == [
        {"type": "redacted_thinking", "data": "opaque-REDACTED-data=="},
        {"type": "thinking", "thinking": "I should list the files.", "signature": "sig-scripted-1"},
        {"type": "text", "text": "Listing."}]
    assert sent["content"][3]["type"] == "tool_use"
    # prompt caching: the system prompt and the moving tail (the last user message: here the tool result)
    assert second["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert second["messages"][-1]["content"][-1]["type"] == "tool_result"
    assert second["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sum("cache_control" in b for m in second["messages"] for b in m["content"]) == 1
    # the session, as pi records thinking
    entries = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    assistants = [e["message"] for e in entries if e.get("message", {}).get("role") == "assistant"]
    assert assistants[0]["content"][:2] == [
        {"type": "thinking", "thinking": "[Reasoning redacted]", "thinkingSignature": "opaque-REDACTED-data==",
         "redacted": True},
        {"type": "thinking", "thinking": "I should list the files.", "thinkingSignature": "sig-scripted-1"}]
    # cache tokens, priced
    usage = assistants[1]["usage"]
    assert (usage["input"], usage["cacheRead"], usage["cacheWrite"], usage["output"]) == (500, 1200, 300, 50)
    assert usage["cost"]["cacheRead"] == pytest.approx(1200 * 0.3 / 1e6)
    assert usage["cost"]["cacheWrite"] == pytest.approx(300 * 3.75 / 1e6)
    assert usage["cost"]["total"] == pytest.approx((500 * 3 + 50 * 15 + 1200 * 0.3 + 300 * 3.75) / 1e6)
    assert outcome.usage.reasoning > 0          # estimated from the thinking text: the API gives no figure


def test_anthropic_unsigned_or_foreign_thinking_goes_back_as_text():
    own_unsigned = AssistantMessage([ThinkingContent("half a thought"), TextContent("A.")], ANTHROPIC, "x", "m")
    foreign = AssistantMessage([ThinkingContent("their thought", "reasoning_content"), TextContent("B.")],
                               OPENAI, "x", "gpt")
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC).stream("", HELLO + [own_unsigned, UserMessage.text("1"), foreign,
                                                     UserMessage.text("2")], [])
        messages = llm.requests[0]["messages"]
    assert messages[1]["content"] == [{"type": "text", "text": "half a thought"}, {"type": "text", "text": "A."}]
    assert messages[3]["content"] == [{"type": "text", "text": "their thought"}, {"type": "text", "text": "B."}]


def test_anthropic_cache_mark_is_never_on_an_assistant_tail():
    with ScriptedLLM([{"text": "ok"}]) as llm:
        provider(llm, ANTHROPIC).stream("S", HELLO + [AssistantMessage([TextContent("prefill")], ANTHROPIC)], [])
        messages = llm.requests[0]["messages"]
    assert messages[-1]["role"] == "assistant" and "cache_control" not in messages[-1]["content"][-1]
