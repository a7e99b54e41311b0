"""Compaction and overflow recovery, through the real loop: the real OpenAI/Anthropic providers over HTTP against the
scripted LLM server, the in-memory sandbox for the tools (no Docker), a real session file.

The model here is a responder: every main call asks for one more big command output (or a read, or a write) until
the job's turns are done; a request with the summariser's system prompt gets a summary."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pid import events as ev
from pid.agent import Agent, Limits
from pid.compaction import (SUMMARIZATION_SYSTEM_PROMPT, SUMMARY_PREFIX, TURN_PREFIX_PROMPT,
                            UPDATE_SUMMARIZATION_PROMPT, Compactor)
from pid.context import MESSAGE_OVERHEAD_TOKENS
from pid.endings import exit_code_for
from pid.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage
from pid.providers import make_provider
from pid.providers.base import ProviderConfig
from pid.session import SessionWriter, session_context
from pid.tokens import get_counter
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM

WINDOW = 32768
OUTPUT_LINE = "0123456789 the quick brown fox jumps over the lazy dog, again and again and again\n"


def dump(command: str, _box: Any) -> Run:
    """`dump N`: about 4 KB of output (a tool output of ~1,400 tokens by pid's estimate)."""
    return Run(f"[{command}]\n" + OUTPUT_LINE * 48)


class LongJob:
    """The model of a long job: `turns` tool calls (mostly big command outputs, now and then a read or a write),
    then a final answer. Summaries when the summariser asks; `overflow` lists main calls refused for length."""

    def __init__(self, turns: int, overflow: set[int] | None = None, always_overflow_from: int | None = None,
                 empty: bool = False) -> None:
        self.turns, self.overflow, self.always_from = turns, overflow or set(), always_overflow_from
        self.empty = empty   # a refusal is llama-cpp-python's: HTTP 200 and no event at all
        self.main_calls = 0
        self.summaries: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if system_text(body).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40]):
            self.summaries.append(body)
            return {"text": f"## Goal\nKeep going. SUMMARY-{len(self.summaries)}"}
        self.main_calls += 1
        n = self.main_calls
        if n in self.overflow or (self.always_from is not None and n >= self.always_from):
            return {"raw": []} if self.empty else {"overflow": WINDOW}
        if n > self.turns:
            return {"text": "all done"}
        if n % 10 == 3:
            return {"tool_calls": [{"name": "read", "arguments": {"path": f"src/file{n % 3}.py"}}]}
        if n % 10 == 7:
            return {"tool_calls": [{"name": "write", "arguments": {"path": f"out/n{n}.txt", "content": "x\n"}}]}
        return {"tool_calls": [{"name": "bash", "arguments": {"command": f"dump {n}"}}]}


def system_text(body: dict[str, Any]) -> str:
    if "system" in body:   # Anthropic
        return "".join(b.get("text", "") for b in body["system"])
    first = body["messages"][0]
    return first["content"] if first["role"] == "system" else ""


def openai_request_tokens(body: dict[str, Any]) -> int:
    """A request's size by the job's own count (pid/context.py's rules, applied to what went over the wire)."""
    counter = get_counter()
    tools = json.dumps([{"name": t["function"]["name"], "description": t["function"]["description"],
                         "parameters": t["function"]["parameters"]} for t in body.get("tools", [])])
    total = counter.count(tools) if body.get("tools") else 0
    for m in body["messages"]:
        parts = [m["content"]] if isinstance(m.get("content"), str) and m["content"] else []
        parts += [c["function"]["name"] + json.dumps(json.loads(c["function"]["arguments"]), ensure_ascii=False)
                  for c in m.get("tool_calls") or []]
        total += counter.count("\n".join(parts)) + MESSAGE_OVERHEAD_TOKENS
    return total


def check_calls_have_results(body: dict[str, Any]) -> None:
    """Every tool call in the request has its result after it, and every result its call before it."""
    open_calls: set[str] = set()
    for m in body["messages"]:
        if m["role"] == "assistant":
            assert not open_calls, f"calls without results before the next assistant message: {open_calls}"
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, f"a result whose call is missing: {m['tool_call_id']}"
            open_calls.discard(m["tool_call_id"])
    assert not open_calls, f"calls without results: {open_calls}"


def make_box() -> MemorySandbox:
    files = {f"/workspace/src/file{i}.py": f"# file {i}\n" + "x = 1\n" * 200 for i in range(3)}
    return MemorySandbox(dump, files=files)


def run_job(llm: ScriptedLLM, tmp_path: Path, *, window: int = WINDOW, api: str = "openai-completions",
            max_turns: int = 400, events: list | None = None, **provider_settings: Any) -> tuple[Any, Agent, Path]:
    provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url, api=api,  # type: ignore[arg-type]
                                            **provider_settings))
    session_path = tmp_path / "session.jsonl"
    session = SessionWriter(str(session_path), cwd=str(tmp_path))
    session.model_change("openai", "scripted")
    sink = events.append if events is not None else ev.ignore
    with make_box() as box:
        agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "You are a test agent.",
                      session=session, sink=sink, limits=Limits(max_turns=max_turns),
                      compactor=Compactor(provider, window))
        outcome = agent.run("Work through the long task.")
    session.close()
    provider.close()
    return outcome, agent, session_path


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_300_turn_job_far_over_its_window_completes_compacting_at_turn_boundaries(tmp_path):
    model = LongJob(turns=300)
    events: list = []
    with ScriptedLLM(responder=model) as llm:
        outcome, agent, session_path = run_job(llm, tmp_path, events=events)
        requests = list(llm.requests)
    assert outcome.status == "completed", outcome.error
    assert outcome.final_message == "all done" and outcome.turns == 301 and outcome.tool_calls == 300
    # the outputs together are many windows' worth
    outputs = sum(len(m.text) for m in agent.messages if isinstance(m, ToolResultMessage))
    assert outputs > 10 * WINDOW * 3

    lines = entries(session_path)
    compactions = [e for e in lines if e["type"] == "compaction"]
    assert len(compactions) >= 5
    by_id = {e["id"]: e for e in lines if "id" in e}
    for c in compactions:
        kept = by_id[c["firstKeptEntryId"]]
        assert kept["type"] == "message" and kept["message"]["role"] in ("user", "assistant")   # never a result
        assert c["tokensBefore"] > WINDOW - 16384
        assert c["fromHook"] is False and set(c["details"]) == {"readFiles", "modifiedFiles"}
    last = compactions[-1]
    assert "src/file1.py" in last["details"]["readFiles"] and any(
        f.startswith("out/n") for f in last["details"]["modifiedFiles"])
    assert "<read-files>" in last["summary"] and "<modified-files>" in last["summary"]

    # what the server received: nothing over the window by the job's count, every call with its result
    main = [r for r in requests if not system_text(r).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40])]
    assert len(main) == 301 and len(model.summaries) >= len(compactions)
    sizes = [openai_request_tokens(r) for r in requests]
    assert max(sizes) <= WINDOW, max(sizes)
    assert max(sizes) > (WINDOW - 16384) // 2     # the window was used, not avoided
    for body in main:
        check_calls_have_results(body)
    # the first compaction cut into the task's own turn (pi's split turn); later ones update the summary
    first_prompt = model.summaries[0]["messages"][-1]["content"]
    assert TURN_PREFIX_PROMPT[:40] in first_prompt and "[User]: Work through the long task." in first_prompt
    later = model.summaries[-1]["messages"][-1]["content"]
    assert UPDATE_SUMMARIZATION_PROMPT[:40] in later and "<previous-summary>" in later
    conversation = later.split("</conversation>")[0]
    assert "[Tool result]: [dump" in conversation and "more characters truncated]" in conversation
    # the model goes on from summary + recent messages
    final = main[-1]["messages"]
    assert final[1]["role"] == "user" and final[1]["content"].startswith(SUMMARY_PREFIX)
    assert f"SUMMARY-{len(model.summaries)}" in final[1]["content"]
    assert final[2]["role"] == "assistant"

    # events and usage: each compaction shows, the summaries' calls are counted
    starts = [e for e in events if isinstance(e, ev.CompactionStart)]
    ends = [e for e in events if isinstance(e, ev.CompactionEnd)]
    assert len(starts) == len(ends) == len(compactions) and all(e.reason == "threshold" for e in starts)
    assert all(e.error is None and e.tokens_after < e.tokens_before for e in ends)
    replies = sum(m.usage.total_tokens for m in agent.messages if isinstance(m, AssistantMessage))
    assert outcome.usage.total_tokens == replies + sum(e.usage.total_tokens for e in ends)
    assert all(e.usage.total_tokens > 0 for e in ends)
    from pid.jobs.progress import Progress     # `pid status` counts them as they happen
    progress = Progress()
    for event in events:
        progress.on_event(event)
    assert progress.snapshot()["usage"]["total_tokens"] == outcome.usage.total_tokens

    # the session file rebuilds the same context pi would
    context = session_context(str(session_path))
    opening = context[0].content[0].text
    assert opening.startswith(SUMMARY_PREFIX) and last["summary"] in opening
    assert isinstance(context[-1], AssistantMessage) and context[-1].text == "all done"


def test_a_refusal_for_length_is_compacted_and_asked_again(tmp_path):
    model = LongJob(turns=6, overflow={5})
    events: list = []
    with ScriptedLLM(responder=model) as llm:
        outcome, agent, session_path = run_job(llm, tmp_path, window=200_000, events=events)
        requests = list(llm.requests)
    assert outcome.status == "completed" and outcome.exit_reason == "stop", outcome.error
    assert len(model.summaries) == 1      # the window was never reached: only the refusal compacted
    ends = [e for e in events if isinstance(e, ev.CompactionEnd)]
    assert [(e.reason, e.will_retry, e.error) for e in ends] == [("overflow", True, None)]
    refused, retried = requests[4], requests[6]   # 5th main call, the summary, then the same call again
    assert len(retried["messages"]) < len(refused["messages"])
    assert retried["messages"][1]["content"].startswith(SUMMARY_PREFIX)
    check_calls_have_results(retried)
    # the refusal stays in the transcript (as pi keeps it), never in a request
    errors = [m for m in agent.messages if isinstance(m, AssistantMessage) and m.stop_reason == "error"]
    assert len(errors) == 1 and "maximum context length" in (errors[0].error_message or "")
    assert all(m.get("content") or m.get("tool_calls") for r in requests[5:] for m in r["messages"]
               if m["role"] == "assistant")
    assert sum(1 for e in entries(session_path) if e["type"] == "compaction") == 1


@pytest.mark.parametrize("api", ["openai-completions", "anthropic-messages"])
def test_refused_for_length_even_after_compacting_ends_with_context_overflow(tmp_path, api):
    model = LongJob(turns=50, always_overflow_from=4)
    with ScriptedLLM(responder=model) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path, window=200_000, api=api)
    assert outcome.exit_reason == "context_overflow" and outcome.status == "failed"
    assert exit_code_for({"exit_reason": outcome.exit_reason}) == 1
    assert "context window" in (outcome.error or "") and "still refused after compacting" in (outcome.error or "")
    assert model.main_calls == 5 and len(model.summaries) == 1    # compacted and retried exactly once


def test_an_empty_response_is_retried_a_little_then_compacted_for_and_finally_said(tmp_path):
    """llama-cpp-python answers a streaming request too long for its context with HTTP 200 and no event: pid used to
    retry that as a broken stream for its whole budget (20 attempts over 300 s). Now: two more tries, then it is
    taken for a refusal for length (compact, ask again); still empty, the job fails saying what the server did."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    retried = LongJob(turns=6, overflow={5, 6, 7}, empty=True)   # the 5th call and its two retries
    with ScriptedLLM(responder=retried) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path / "a", window=200_000, retry_base_s=0.01)
    assert outcome.status == "completed" and len(retried.summaries) == 1, outcome.error
    assert retried.main_calls == 4 + 3 + 1   # four answered, the 5th three times empty, then its answer
    stuck = LongJob(turns=50, always_overflow_from=4, empty=True)
    with ScriptedLLM(responder=stuck) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path / "b", window=200_000, retry_base_s=0.01)
    assert (outcome.exit_reason, outcome.status) == ("context_overflow", "failed")
    assert "the server returned an empty response" in (outcome.error or "") and "after 3 attempts" in outcome.error
    assert stuck.main_calls == 3 + 3 + 3 and len(stuck.summaries) == 1


def test_refused_for_length_with_nothing_to_compact_ends_at_once(tmp_path):
    model = LongJob(turns=5, always_overflow_from=1)
    with ScriptedLLM(responder=model) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path, window=200_000)
    assert outcome.exit_reason == "context_overflow"
    assert "nothing older than the most recent turn" in (outcome.error or "")
    assert model.main_calls == 1 and not model.summaries


def test_a_failed_summary_is_reported_and_the_job_goes_on(tmp_path):
    """Threshold compaction whose summary call fails: the event says why, the call goes ahead (it may still fit)."""
    model = LongJob(turns=20)
    failing = {"n": 0}

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if system_text(body).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40]) and failing["n"] == 0:
            failing["n"] += 1
            return {"error": {"status": 400, "message": "summaries are off today"}}
        return model(body)

    events: list = []
    with ScriptedLLM(responder=responder) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path, events=events)
    assert outcome.status == "completed", outcome.error
    ends = [e for e in events if isinstance(e, ev.CompactionEnd)]
    assert ends[0].error and "summaries are off today" in ends[0].error
    assert any(e.error is None for e in ends[1:])


# -- the cut ---------------------------------------------------------------------------------------------------------

def _turns(n: int, size: int = 3000) -> list:
    messages: list = [UserMessage.text("task")]
    for i in range(n):
        messages.append(AssistantMessage([TextContent("t"), ToolCall(f"c{i}", "bash", {"command": "x"}),
                                          ToolCall(f"d{i}", "bash", {"command": "y"})]))
        messages.append(ToolResultMessage(f"c{i}", "bash", [TextContent("a" * size)]))
        messages.append(ToolResultMessage(f"d{i}", "bash", [TextContent("b" * size)]))
    return messages


def test_the_cut_is_never_at_a_tool_result_and_keeps_about_keep_tokens():
    compactor = Compactor(make_provider(ProviderConfig(model="m", base_url="http://127.0.0.1:9/v1")), 200_000)
    messages = _turns(40)
    for keep in (1, 1500, 5000, 20000):
        cut = compactor.find_cut_point(messages, 0, len(messages), keep)
        assert isinstance(messages[cut.first_kept], (UserMessage, AssistantMessage))
        kept = sum(compactor.message_tokens(m) for m in messages[cut.first_kept:])
        assert kept <= max(keep, compactor.message_tokens(messages[-1]) * 3)
        assert cut.split_turn and cut.turn_start == 0
    # everything fits in keep: nothing to cut
    assert compactor.find_cut_point(messages, 0, len(messages), 10**9).first_kept == 0
    # a steer (user message) inside the range: cutting there splits no turn
    messages.insert(31, UserMessage.text("steer"))
    cut = compactor.find_cut_point(messages, 0, len(messages), 1)
    assert cut.turn_start == 31 and cut.split_turn


def test_small_windows_scale_the_reserve_and_the_kept_part():
    provider = make_provider(ProviderConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    big, small = Compactor(provider, 200_000), Compactor(provider, 8192)
    assert (big.reserve, big.keep, big.threshold) == (16384, 20000, 200_000 - 16384)
    assert (small.reserve, small.threshold, small.keep) == (4096, 4096, 1024)
    assert (big.summary_tokens, big.turn_summary_tokens) == (13107, 8192)   # pi's: 0.8 and 0.5 of the reserve
    assert (small.summary_tokens, small.turn_summary_tokens) == (1024, 512)


def test_a_summary_is_cut_only_when_far_over_its_budget():
    """pid's count is not the model's (o200k against the model's tokenizer; the estimate over-counts ordinary text by
    a third): a summary the model kept within its budget is never cut, one far over it is, with a note."""
    provider = make_provider(ProviderConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    compactor = Compactor(provider, WINDOW)
    counter = compactor.counter
    within = " ".join(f"word{i}" for i in range(1500))   # ~4 bytes a token: at most 4096 of a model's tokens
    assert len(within.encode()) <= 4 * 4096 and compactor._within(within, 4096) == within
    far = " ".join(f"detail{i}" for i in range(8000))
    cut = compactor._within(far, 4096)
    assert cut.endswith("[summary cut: the model wrote more than the 4096 tokens asked for]")
    assert far.startswith(cut.split("\n[summary cut")[0])
    assert counter.count(cut.split("\n[summary cut")[0]) <= 4096 * (3 / 2 if counter.exact else 2)


def test_long_summaries_in_a_small_window_leave_room_to_work_in(tmp_path):
    """With pi's sizes a 32k window compacted before most calls when the model wrote long summaries (summary and
    kept part filled what compacting had freed). The summary's budget scales with the window, and a server that
    sends far more than it was asked for has its summary cut."""
    class Verbose(LongJob):
        def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
            reply = super().__call__(body)
            if "SUMMARY-" in reply.get("text", ""):   # ~18k tokens, whatever max_tokens asked for
                reply["text"] += "\n" + " ".join(f"detail{i}" for i in range(6000))
            return reply
    model = Verbose(turns=60)
    with ScriptedLLM(responder=model) as llm:
        outcome, agent, session_path = run_job(llm, tmp_path)
    assert outcome.status == "completed", outcome.error
    compactions = [e for e in entries(session_path) if e["type"] == "compaction"]
    assert 3 <= len(compactions) <= 15, len(compactions)   # 42 of 61 calls before
    assert all("[summary cut: the model wrote more than the" in c["summary"] for c in compactions)
    assert {s["max_tokens"] for s in model.summaries} <= {4096, 2048}


def test_a_summary_asks_for_no_more_than_the_model_can_answer(tmp_path):
    model = LongJob(turns=20)
    with ScriptedLLM(responder=model) as llm:
        provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url))
        with make_box() as box:
            agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "system",
                          compactor=Compactor(provider, WINDOW, max_output_tokens=1024))
            assert agent.run("go").status == "completed"
        provider.close()
    assert model.summaries and {s["max_tokens"] for s in model.summaries} == {1024}


def test_a_summary_call_is_made_by_a_sibling_of_the_jobs_provider(tmp_path):
    """Its sibling knows what the job's provider learned of the endpoint (a refusal once it answered is a restart:
    tests/test_providers.py), where a provider made anew would take it for a wrong URL."""
    model = LongJob(turns=20)
    with ScriptedLLM(responder=model) as llm:
        provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url))
        siblings: list[Any] = []
        made_by = provider.sibling
        provider.sibling = lambda config: siblings.append(made_by(config)) or siblings[-1]  # type: ignore[method-assign]
        with make_box() as box:
            agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "system",
                          compactor=Compactor(provider, WINDOW, max_output_tokens=1024))
            assert agent.run("go").status == "completed"
        provider.close()
    assert model.summaries and len(siblings) == len(model.summaries)
    assert all((s.config.max_tokens, s.config.thinking) == (1024, "off") for s in siblings)


def test_without_a_compaction_the_session_context_is_the_whole_branch():
    from pid.session import read_session
    fixture = Path(__file__).parent / "fixtures" / "pi-session-v3-sample.jsonl"
    context = session_context(str(fixture))
    assert [m.to_dict() for m in context] == [m.to_dict() for m in read_session(str(fixture))[1]]


def test_cancel_during_a_summary_ends_the_job_at_once(tmp_path):
    import threading
    import time
    model = LongJob(turns=40)

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        turn = model(body)
        return {**turn, "delay_s": 30} if model.summaries else turn

    holder: list[Agent] = []

    def sink(event: Any) -> None:
        if isinstance(event, ev.CompactionStart):
            threading.Timer(0.2, holder[0].cancel).start()

    with ScriptedLLM(responder=responder) as llm:
        provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url))
        with make_box() as box:
            agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "system", sink=sink,
                          compactor=Compactor(provider, WINDOW))
            holder.append(agent)
            started = time.monotonic()
            outcome = agent.run("go")
            elapsed = time.monotonic() - started
        provider.close()
    assert outcome.exit_reason == "cancelled" and len(model.summaries) == 1
    assert elapsed < 10      # not the summary's 30 s
