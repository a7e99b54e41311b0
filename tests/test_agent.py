"""The loop's flow control, against the real OpenAI-compatible provider, the scripted LLM server over HTTP, and the
in-memory sandbox (no Docker: commands are scripted below): parallel tools in call order, steering, follow-ups,
pause, cancel, length stops, caps. The loop against a real container: test_e2e*.py."""
from __future__ import annotations

import json
import threading
import time

import pytest

from pid import events as ev
from pid.agent import (LEFT_OUT_CALLS, LENGTH_STOP_TOOL_ERROR, MAX_CALLS_PER_REPLY, TOO_MANY_CALLS_ERROR, Agent,
                       Limits)
from pid.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage
from pid.providers import make_provider
from pid.providers.base import ProviderConfig
from pid.tools.base import ToolContext
from pid.providers.transport import MAX_REPLY_BYTES
from pid.tools.registry import MAX_ARGUMENT_BYTES, default_registry
from tests.memory_sandbox import Commands, MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM

# What the commands these tests send do (each takes its pauses for real: timeouts and cancel are real too).
COMMANDS = Commands({
    "sleep 0.5; echo first": Run(0.5, "first\n"), "sleep 0.4; echo second": Run(0.4, "second\n"),
    "sleep 0.3; echo third": Run(0.3, "third\n"),
    "sleep 0.5; echo slow": Run(0.5, "slow\n"), "echo fast": Run("fast\n"), "echo hi": Run("hi\n"),
    "sleep 100": Run(100.0), "sleep 5": Run(5.0), "true": Run(), "touch ran-it": Run(),
})


@pytest.fixture
def sandbox():
    with MemorySandbox(COMMANDS) as box:
        yield box


def make_agent(llm: ScriptedLLM, sandbox, *, limits: Limits | None = None, sink=ev.ignore, check_in=None,
               **config) -> Agent:
    provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url, **config))
    return Agent(provider, default_registry(), ToolContext(sandbox=sandbox), "system prompt", sink=sink,
                 limits=limits, check_in=check_in)


class LateMail:
    """A relay stand-in for Agent(check_in=...): a follow-up that reaches the store only once `arrived()` holds,
    handed to the agent at its first check-in after that."""

    def __init__(self, text: str, arrived) -> None:
        self.text: str | None = text
        self.arrived = arrived
        self.agent: Agent | None = None

    def check_in(self) -> None:
        if self.text is not None and self.arrived():
            assert self.agent is not None
            self.agent.follow_up(self.text)
            self.text = None


def tool_messages(request: dict) -> list[dict]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def bash(command: str, **extra) -> dict:
    return {"name": "bash", "arguments": {"command": command, **extra}}


def test_parallel_tool_calls_run_concurrently_and_results_keep_call_order():
    """Each command starts by waiting until all three have started: run one after another, the first would wait
    alone, give up and say so. (Not a stopwatch: a loaded machine makes side by side as slow as one after another.)"""
    together = threading.Barrier(3)

    def side_by_side(run: Run):
        def handler(command: str, box: MemorySandbox) -> Run:
            try:
                together.wait(timeout=30)
            except threading.BrokenBarrierError:
                return Run("ran alone\n", exit_code=1)
            return run
        return handler
    commands = {"sleep 0.5; echo first": side_by_side(Run(0.5, "first\n")),
                "sleep 0.4; echo second": side_by_side(Run(0.4, "second\n")),
                "sleep 0.3; echo third": side_by_side(Run(0.3, "third\n"))}
    script = [{"tool_calls": [bash("sleep 0.5; echo first"), bash("sleep 0.4; echo second"),
                              bash("sleep 0.3; echo third")]},
              {"text": "done"}]
    with MemorySandbox(commands) as sandbox, ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox).run("go")
        results = tool_messages(llm.requests[1])
    assert outcome.status == "completed" and outcome.tool_calls == 3
    assert [r["content"].strip() for r in results] == ["first", "second", "third"]   # not the order they ended


def test_steering_lands_after_the_running_batch_and_before_the_next_model_call(sandbox):
    script = [{"tool_calls": [bash("sleep 0.5; echo slow"), bash("echo fast")]}, {"text": "steered"}]
    with ScriptedLLM(script) as llm:
        holder: list[Agent] = []

        def sink(event):
            if isinstance(event, ev.ToolStart) and event.arguments["command"].startswith("sleep"):
                holder[0].steer("change of plan")

        agent = make_agent(llm, sandbox, sink=sink)
        holder.append(agent)
        outcome = agent.run("go")
        second = llm.requests[1]["messages"]
    assert outcome.final_message == "steered"
    roles = [m["role"] for m in second]
    assert roles[-4:] == ["assistant", "tool", "tool", "user"]
    assert [m["content"].strip() for m in second[-3:-1]] == ["slow", "fast"]  # nothing skipped
    assert second[-1]["content"] in ("change of plan", [{"type": "text", "text": "change of plan"}])


def test_follow_up_continues_a_finished_agent(sandbox):
    with ScriptedLLM([{"text": "first answer"}, {"text": "second answer"}]) as llm:
        agent = make_agent(llm, sandbox)
        agent.follow_up("one more thing")
        outcome = agent.run("go")
        assert len(llm.requests) == 2
        last_user = llm.requests[1]["messages"][-1]
    assert outcome.final_message == "second answer" and outcome.turns == 2
    assert "one more thing" in str(last_user["content"])
    assert [type(m).__name__ for m in agent.messages] == ["UserMessage", "AssistantMessage", "UserMessage",
                                                          "AssistantMessage"]


def test_mail_collected_as_the_agent_would_stop_continues_it(sandbox):
    """A follow-up that reached the store while the model wrote its last reply is asked for as the agent would
    stop (no check-in before a model call comes after that reply), not left behind."""
    with ScriptedLLM([{"text": "first answer"}, {"text": "second answer"}]) as llm:
        mail = LateMail("one more thing", arrived=lambda: len(llm.requests) == 1)
        agent = mail.agent = make_agent(llm, sandbox, check_in=mail.check_in)
        outcome = agent.run("go")
    assert outcome.final_message == "second answer" and len(llm.requests) == 2
    assert "one more thing" not in str(llm.requests[0]["messages"])
    assert "one more thing" in str(llm.requests[1]["messages"][-1]["content"])


def test_pause_holds_the_next_model_call_until_resume(sandbox):
    with ScriptedLLM([{"text": "after resume"}]) as llm:
        agent = make_agent(llm, sandbox)
        agent.pause()
        threading.Timer(0.6, agent.resume).start()
        started = time.monotonic()
        outcome = agent.run("go")
    assert outcome.final_message == "after resume"
    assert time.monotonic() - started >= 0.55


def test_a_paused_agent_still_honours_its_wall_clock(sandbox):
    with ScriptedLLM([{"text": "never"}]) as llm:
        agent = make_agent(llm, sandbox, limits=Limits(wall_clock_s=0.5))
        agent.pause()
        outcome = agent.run("go")
        assert llm.requests == []
    assert (outcome.status, outcome.exit_reason) == ("limit", "wall_clock")


def test_cancel_stops_a_running_command_within_seconds(sandbox):
    with ScriptedLLM([{"tool_calls": [bash("sleep 100")]}, {"text": "never"}]) as llm:
        agent = make_agent(llm, sandbox)
        threading.Timer(0.5, agent.cancel).start()
        started = time.monotonic()
        outcome = agent.run("go")
        assert len(llm.requests) == 1
    assert outcome.status == "cancelled"
    assert time.monotonic() - started < 5
    assert sandbox.commands == ["sleep 100"] and sandbox.calls[0].result.cancelled


def test_cancel_during_a_silent_model_stream(sandbox):
    with ScriptedLLM([{"stall_s": 30, "text": "slow answer"}]) as llm:
        agent = make_agent(llm, sandbox)
        threading.Timer(0.3, agent.cancel).start()
        started = time.monotonic()
        outcome = agent.run("go")
    assert outcome.status == "cancelled" and time.monotonic() - started < 3
    assert agent.messages[-1].stop_reason == "aborted"  # kept in the session, not replayed


def test_length_stop_fails_its_tool_calls_without_running_them(sandbox):
    script = [{"finish_reason": "length", "tool_calls": [bash("touch ran-it")]}, {"text": "retrying later"}]
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox).run("go")
        result = tool_messages(llm.requests[1])[0]["content"]
    assert result == LENGTH_STOP_TOOL_ERROR.format(name="bash")
    assert outcome.status == "completed"
    assert sandbox.commands == []


def test_a_reply_runs_at_most_its_share_of_tool_calls_and_answers_the_rest(sandbox):
    """What a reply's calls return is held together: an endpoint's reply of 4,000 `read`s took 1.1 GB (an attack
    review's). The first MAX_CALLS_PER_REPLY run; the next gets an error saying how many the reply made, and the
    ones after it are left out of the transcript: an endpoint that sent 40,000 a turn grew a job by ~50 MB a turn."""
    calls = [bash(f"echo {n}") for n in range(MAX_CALLS_PER_REPLY + 3)]
    with ScriptedLLM([{"tool_calls": calls}, {"text": "done"}]) as llm:
        agent = make_agent(llm, sandbox)
        outcome = agent.run("go")
        results = [m["content"] for m in tool_messages(llm.requests[1])]
        replayed = [m for m in llm.requests[1]["messages"] if m["role"] == "assistant"][0]
    assert outcome.status == "completed" and outcome.tool_calls == MAX_CALLS_PER_REPLY + 3
    assert sorted(sandbox.commands) == sorted(f"echo {n}" for n in range(MAX_CALLS_PER_REPLY))
    assert len(results) == MAX_CALLS_PER_REPLY + 1
    after = LEFT_OUT_CALLS.format(count=2)
    assert results[-1] == TOO_MANY_CALLS_ERROR.format(name="bash", limit=MAX_CALLS_PER_REPLY,
                                                      made=MAX_CALLS_PER_REPLY + 3, after=after)
    assert len(replayed["tool_calls"]) == MAX_CALLS_PER_REPLY + 1      # as the model is shown its own reply
    assert len(agent.messages[1].tool_calls) == MAX_CALLS_PER_REPLY + 1  # and as the transcript keeps it


def test_an_answer_cut_at_the_output_limit_ends_the_job_as_a_limit_not_completed(sandbox):
    """A reply with finish_reason length and no tool call never said it was done (a local server's output cap):
    the job ends `length`, status limit, exit code 3, with the text so far as its final message."""
    from pid.endings import exit_code_of
    with ScriptedLLM([{"text": "The fix is to change", "finish_reason": "length"}]) as llm:
        outcome = make_agent(llm, sandbox).run("go")
    assert (outcome.exit_reason, outcome.status, exit_code_of(outcome.exit_reason)) == ("length", "limit", 3)
    assert outcome.final_message == "The fix is to change" and "output-token limit" in (outcome.error or "")


def test_bad_tool_calls_become_readable_errors_and_the_loop_goes_on(sandbox):
    script = [{"tool_calls": [{"name": "nope", "arguments": {}}, {"name": "bash", "raw_arguments": "{not json"},
                              {"name": "read", "arguments": {"offset": 3}}]},
              {"text": "recovered"}]
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox).run("go")
        unknown, invalid, schema = (m["content"] for m in tool_messages(llm.requests[1]))
    assert outcome.final_message == "recovered"
    assert unknown == "Tool nope not found"
    assert "{not json" in invalid and "JSON" in invalid
    assert schema.startswith('Validation failed for tool "read":\n  - path:')


def test_max_turns_and_consecutive_timeouts_end_with_their_own_reason(sandbox):
    with ScriptedLLM([{"tool_calls": [bash("true")]}] * 3) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_turns=2)).run("go")
    assert (outcome.status, outcome.exit_reason, outcome.turns) == ("limit", "max_turns", 2)

    with ScriptedLLM([{"tool_calls": [bash("sleep 5", timeout=0.3)]}] * 4) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_consecutive_timeouts=2)).run("go")
    assert (outcome.status, outcome.exit_reason, outcome.turns) == ("limit", "consecutive_timeouts", 2)
    assert outcome.error == "the commands of 2 turns in a row timed out"


def test_parallel_timeouts_of_one_turn_count_once_so_the_model_sees_them(sandbox):
    """A new user's: three parallel calls that timed out ended the job before the model saw any of them."""
    slow = [bash("sleep 5", timeout=0.3)] * 3
    script = [{"tool_calls": slow}, {"tool_calls": [bash("true")]}, {"tool_calls": slow}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_consecutive_timeouts=2)).run("go")
    assert (outcome.exit_reason, outcome.turns) == ("stop", 4), outcome


def test_max_cost_ends_the_job(sandbox):
    script = [{"tool_calls": [bash("true")], "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}] * 3
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=1.5), input_cost_per_mtok=1.0).run("go")
    assert (outcome.status, outcome.exit_reason, outcome.turns) == ("limit", "max_cost", 2)
    assert outcome.usage.cost.total == pytest.approx(2.0)
    assert outcome.error == "cost $2.0000 exceeded --max-cost $1.5000"


def test_a_final_answer_that_passes_max_cost_completes_the_job_with_it(sandbox):
    """A new user's: the one answer of a job cost more than --max-cost, and the job ended `max_cost` with no final
    message, where --max-turns 1 completed it. The cap is looked at before each call: this answer is the job's end."""
    script = [{"text": "ALL FINISHED: here is my final answer",
               "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}]
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=0.5), input_cost_per_mtok=1.0).run("go")
    assert (outcome.status, outcome.exit_reason, outcome.error) == ("completed", "stop", None)
    assert outcome.final_message == "ALL FINISHED: here is my final answer"
    assert outcome.usage.cost.total == pytest.approx(1.0)


@pytest.mark.parametrize("limit", ["max_cost", "max_turns"])
def test_a_final_answer_with_a_message_waiting_and_no_room_left_ends_at_the_limit_saying_so(sandbox, limit):
    """A review's find: a follow-up waiting as the last allowed call answered was taken out of the inbox, and the
    loop then ended at its limit without it, saying nothing (before, for --max-turns too). The answer is kept, the
    job ends at its limit (more was asked than it had room for), and the message is said not delivered."""
    events: list[ev.Event] = []
    agent: Agent | None = None

    def sink(event: ev.Event) -> None:
        events.append(event)
        if isinstance(event, ev.TurnStart):   # (during the call: the loop looks once it has the answer)
            assert agent is not None and agent.follow_up("and now the docs")
    script = [{"text": "the answer", "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}]
    limits = Limits(max_cost=0.5) if limit == "max_cost" else Limits(max_turns=1)
    with ScriptedLLM(script) as llm:
        agent = make_agent(llm, sandbox, limits=limits, sink=sink, input_cost_per_mtok=1.0)
        outcome = agent.run("go")
        assert len(llm.requests) == 1
    assert (outcome.exit_reason, outcome.final_message) == (limit, "the answer")
    notices = [e.text for e in events if isinstance(e, ev.Notice)]
    assert any(n.startswith("follow-up not delivered") and n.endswith("and now the docs") for n in notices), notices


def _failing_after_usage(prompt: int, completion: int) -> dict:
    """An OpenAI stream that reports its usage, then an error event: retried (the usage is the server's word)."""
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                                     "finish_reason": None}]}
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    error = {"error": {"message": "server overloaded", "type": "server_error", "code": 502}}
    return {"raw": [f"data: {json.dumps(e)}\n\n" for e in (chunk, usage, error)]}


def test_max_cost_counts_failed_attempts_and_stops_their_retries(sandbox):
    """A hostile-endpoint tester's find: each attempt reported $2 before failing, and pid retried it 29 times under
    --max-cost 0.01 (the cap was looked at between turns only), and counted none of it."""
    with ScriptedLLM([_failing_after_usage(1_000_000, 1_000_000)] * 3 + [{"text": "never"}]) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=0.01), input_cost_per_mtok=1.0,
                             output_cost_per_mtok=1.0, max_retry_wait_s=0.01).run("go")
        assert len(llm.requests) == 1
    assert (outcome.exit_reason, outcome.turns) == ("max_cost", 1), outcome
    assert outcome.usage.cost.total == pytest.approx(2.0) and outcome.usage.input == 1_000_000

    with ScriptedLLM([_failing_after_usage(1000, 1000)] * 2 + [{"text": "done", "usage": {
            "prompt_tokens": 10, "completion_tokens": 10}}]) as llm:   # room for the retries: each one counts
        agent = make_agent(llm, sandbox, limits=Limits(max_cost=1.0), input_cost_per_mtok=1.0,
                           output_cost_per_mtok=1.0, max_retry_wait_s=0.01)
        outcome = agent.run("go")
        assert len(llm.requests) == 3
    assert (outcome.exit_reason, outcome.final_message) == ("stop", "done")
    assert outcome.usage.input == 2010 and outcome.usage.output == 2010
    # the reply's own usage is its own: compaction takes the newest one's as the context's size (a review's find)
    assert (agent.messages[-1].usage.input, agent.messages[-1].usage.output) == (10, 10)

    reply = {"raw": ['data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "done, at length"}, '
                     '"finish_reason": "stop"}]}\n\n', "data: [DONE]\n\n"]}   # (its usage: none said)
    with ScriptedLLM([_failing_after_usage(1000, 1000), reply]) as llm:
        outcome = make_agent(llm, sandbox, input_cost_per_mtok=1.0, max_retry_wait_s=0.01).run("go")
    assert outcome.final_message == "done, at length"   # estimated, though the failed attempt's count came first
    assert outcome.usage.input > 1000 and outcome.usage.output > 1000 and outcome.usage.estimated, outcome.usage


def test_an_endless_reply_cut_at_its_bound_is_not_free(sandbox):
    """A hostile-endpoint tester's: a reply stopped at MAX_REPLY_BYTES (the server said nothing of its usage) counted
    0 tokens, $0, though a real service bills all of it; it is estimated now, and --max-cost sees it."""
    with ScriptedLLM([{"endless": "text"}]) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=0.5), output_cost_per_mtok=1.0).run("go")
    assert (outcome.exit_reason, outcome.turns) == ("max_cost", 1), outcome
    assert MAX_REPLY_BYTES // 4 <= outcome.usage.output <= MAX_REPLY_BYTES // 2 and outcome.usage.input > 0
    assert outcome.usage.estimated   # (said so wherever the usage is shown)


def test_a_cost_just_past_max_cost_is_said_with_the_digits_that_show_it(sandbox):
    script = [{"tool_calls": [bash("true")], "usage": {"prompt_tokens": 1_000_250, "completion_tokens": 0}}] * 2
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=0.001), input_cost_per_mtok=0.001).run("go")
    assert outcome.exit_reason == "max_cost"
    assert outcome.error == "cost $0.0010003 exceeded --max-cost $0.0010000"


def test_max_cost_counts_the_jobs_earlier_attempts(sandbox):
    """A job handed back (its worker stopped) or taken up after its worker died runs again: its max_cost is the
    job's, not each attempt's (a new-user test saw $0.54 spent under --max-cost 0.25 after one hand-back)."""
    script = [{"tool_calls": [bash("true")], "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}] * 3
    with ScriptedLLM(script) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=1.5, spent_cost=1.0),
                             input_cost_per_mtok=1.0).run("go")
    assert (outcome.exit_reason, outcome.turns) == ("max_cost", 1)
    assert outcome.error == "cost $2.0000 exceeded --max-cost $1.5000 over its attempts"

    with ScriptedLLM(script) as llm:   # the earlier attempts used it all: no model call at all
        outcome = make_agent(llm, sandbox, limits=Limits(max_cost=1.5, spent_cost=1.6),
                             input_cost_per_mtok=1.0).run("go")
    assert (outcome.exit_reason, outcome.turns, len(llm.requests)) == ("max_cost", 0, 0)


def test_provider_error_fails_the_job_with_the_message(sandbox):
    with ScriptedLLM([{"error": {"status": 400, "body": {"error": {"message": "model not found"}}}}]) as llm:
        outcome = make_agent(llm, sandbox).run("go")
    assert outcome.status == "failed" and outcome.exit_reason == "provider_error"
    assert "model not found" in outcome.error


def test_an_endless_reply_fails_the_job_saying_it_was_too_large(sandbox):
    """Issue 21, finding 6: the turn ends at the reply's bound with an error that says so; nothing runs."""
    with ScriptedLLM([{"endless": "arguments"}]) as llm:
        outcome = make_agent(llm, sandbox).run("go")
    assert (outcome.status, outcome.exit_reason, outcome.tool_calls) == ("failed", "provider_error", 0)
    assert f"the model's reply exceeded {MAX_REPLY_BYTES} bytes" in outcome.error
    assert sandbox.commands == []


def test_an_oversized_argument_is_refused_before_anything_is_sent_to_the_sandbox(sandbox):
    """Issue 21, finding 6: one argument over MAX_ARGUMENT_BYTES (here within the reply's bound) is an error the
    model reads; the command never reaches the sandbox, and the loop goes on."""
    command = "echo hi #" + "x" * MAX_ARGUMENT_BYTES
    with ScriptedLLM([{"tool_calls": [bash(command), bash("echo hi")]}, {"text": "smaller then"}]) as llm:
        outcome = make_agent(llm, sandbox).run("go")
        refused, ran = (m["content"] for m in tool_messages(llm.requests[1]))
    assert outcome.final_message == "smaller then"
    assert refused.startswith(f'Argument "command" of tool "bash" is {len(command)} bytes, over the limit of '
                              f'{MAX_ARGUMENT_BYTES} bytes (2 MiB) for one argument, so the tool was not run.')
    assert len(refused) < 500
    assert ran.strip() == "hi" and sandbox.commands == ["echo hi"]


def test_failed_replies_are_not_replayed_and_unanswered_calls_get_a_result(sandbox):
    with ScriptedLLM([]) as llm:
        agent = make_agent(llm, sandbox)
    agent.messages = [
        UserMessage.text("task"),
        AssistantMessage([ToolCall("c1", "bash", {"command": "ls"})], stop_reason="toolUse"),
        AssistantMessage([TextContent("half")], stop_reason="error", error_message="boom"),
        AssistantMessage([ToolCall("c2", "bash", {"command": "ls"})], stop_reason="aborted"),
    ]
    context = agent._context_messages()
    assert [type(m).__name__ for m in context] == ["UserMessage", "AssistantMessage", "ToolResultMessage"]
    assert isinstance(context[2], ToolResultMessage) and context[2].is_error and context[2].tool_call_id == "c1"


def test_events_arrive_in_lifecycle_order_with_the_reply_streamed_as_text_deltas(sandbox):
    seen: list[ev.Event] = []
    with ScriptedLLM([{"tool_calls": [bash("echo hi")]}, {"text": "bye for now"}]) as llm:
        make_agent(llm, sandbox, sink=lambda e: seen.append(e) if e.type != "tool_update" else None).run("go")
    tags = [e.type for e in seen]
    assert tags[:8] == ["agent_start", "turn_start", "message_end", "message_end", "tool_start", "tool_end",
                        "message_end", "turn_end"]
    assert tags[8:10] == ["turn_start", "text_delta"] and tags[-3:] == ["message_end", "turn_end", "agent_end"]
    assert set(tags[9:-3]) == {"text_delta"}
    assert "".join(e.text for e in seen if isinstance(e, ev.TextDelta)) == "bye for now"
    assert {e.turn for e in seen if isinstance(e, ev.TextDelta)} == {2}


def test_the_sink_never_sees_two_events_at_once_even_from_parallel_tools(sandbox):
    inside = threading.Lock()
    overlaps: list[str] = []

    def sink(event):
        if not inside.acquire(blocking=False):
            overlaps.append(event.type)
            return
        try:
            time.sleep(0.002)   # widen the window a concurrent call would hit
        finally:
            inside.release()

    calls = [bash(f"for i in 1 2 3; do echo {n}; sleep 0.05; done") for n in range(4)]
    with ScriptedLLM([{"tool_calls": calls}, {"text": "done"}]) as llm:
        outcome = make_agent(llm, sandbox, sink=sink).run("go")
    assert outcome.status == "completed" and outcome.tool_calls == 4 and overlaps == []


def test_a_steer_sent_while_paused_reaches_the_first_call_after_resume(sandbox):
    with ScriptedLLM([{"tool_calls": [bash("echo one")]}, {"text": "two"}]) as llm:
        holder: list[Agent] = []

        def sink(event):   # pause as the first turn ends; steer while paused; then resume
            if isinstance(event, ev.TurnEnd) and event.turn == 1:
                holder[0].pause()
                threading.Timer(0.1, holder[0].steer, args=("while you were paused",)).start()
                threading.Timer(0.3, holder[0].resume).start()

        agent = make_agent(llm, sandbox, sink=sink)
        holder.append(agent)
        outcome = agent.run("go")
        second = llm.requests[1]["messages"]
    assert outcome.final_message == "two" and len(llm.requests) == 2
    assert second[-1]["role"] == "user" and "while you were paused" in str(second[-1]["content"])


def test_a_server_that_streams_no_usage_still_gets_counted(sandbox):
    no_usage = [
        'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":"counted answer"}}]}\n\n',
        'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        "data: [DONE]\n\n"]
    with ScriptedLLM([{"raw": no_usage}]) as llm:
        outcome = make_agent(llm, sandbox, input_cost_per_mtok=1.0).run("a task of some length " * 20)
    assert outcome.final_message == "counted answer"
    assert outcome.usage.input > 100 and 0 < outcome.usage.output < 10  # tiktoken, or its labelled estimate offline
    assert outcome.usage.cost.input == pytest.approx(outcome.usage.input / 1e6)
    # marked as pid's count, and counting what was sent: the tool schemas too (pid's own context count has them)
    from pid.context import count_context, tools_text
    from pid.messages import UserMessage
    from pid.tokens import get_counter
    assert outcome.usage.estimated and outcome.usage.to_result()["estimated"] is True
    counter = get_counter()
    sent = count_context(counter, "system prompt", [UserMessage.text("a task of some length " * 20)])
    assert outcome.usage.input == sent + counter.count(tools_text(default_registry().specs())) > sent + 500


def test_a_steer_during_the_final_reply_is_delivered_not_dropped(sandbox):
    with ScriptedLLM([{"delay_s": 0.5, "text": "thought I was done"}, {"text": "handled the steer"}]) as llm:
        agent = make_agent(llm, sandbox)
        threading.Timer(0.2, agent.steer, args=("one more thing",)).start()
        outcome = agent.run("go")
        assert len(llm.requests) == 2 and "one more thing" in str(llm.requests[1]["messages"][-1]["content"])
    assert outcome.final_message == "handled the steer"


def test_a_gate_asked_before_every_model_call_ends_the_run_with_its_reason(sandbox):
    asked: list[int] = []

    def gate():   # a batch's budget, spent once two calls were made
        asked.append(1)
        return ("batch_budget", "the batch's budget is spent") if len(asked) > 2 else None

    with ScriptedLLM([{"tool_calls": [bash("true")]}] * 5) as llm:
        outcome = make_agent(llm, sandbox, limits=Limits(gate=gate)).run("go")
        calls = len(llm.requests)
    assert (outcome.status, outcome.exit_reason, outcome.error) == ("cancelled", "batch_budget",
                                                                    "the batch's budget is spent")
    assert (outcome.turns, calls, len(asked)) == (2, 2, 3)


def test_a_steer_the_loop_never_reads_again_is_said_and_one_after_the_end_is_refused(sandbox):
    """A steer that came as the job hit a limit (here, during its last turn's tool call) was queued for a loop that
    never looked again: it is said not delivered, in the agent's events; one sent after the end is refused."""
    events: list[ev.Event] = []
    agent: Agent | None = None

    def sink(event: ev.Event) -> None:
        events.append(event)
        if isinstance(event, ev.ToolStart):
            assert agent is not None and agent.steer("also fix the docs")
    with ScriptedLLM([{"tool_calls": [bash("echo hi")]}, {"text": "never asked"}]) as llm:
        agent = make_agent(llm, sandbox, limits=Limits(max_turns=1), sink=sink)
        outcome = agent.run("go")
    assert (outcome.exit_reason, agent.ended) == ("max_turns", True)
    notices = [e.text for e in events if isinstance(e, ev.Notice)]
    assert "steer not delivered: the agent had ended (`pid continue` carries on with a message): also fix the docs" \
        in notices, notices
    assert [type(e) for e in events][-1] is ev.AgentEnd   # said before the end
    assert agent.steer("too late") is False and agent.follow_up("too late") is False
