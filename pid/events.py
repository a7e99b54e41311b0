"""Everything the agent loop tells the world, as one union of plain dataclasses (pi's AgentEvent, in pid's words).

The CLI's printer, the worker's progress and any later consumer read only these events.

Order, for one run:

    agent_start
    notice* (set-up warnings, e.g. a model the table does not know)
    turn_start
        message_end (user: the task, then steering or follow-up messages delivered at this point)
        [compaction_start, model_retry*, compaction_end] (the context would not fit: older messages become a
            summary; a summary call that must be retried waits as any model call does)
        text_delta* (the model's reply as it streams)
        [model_retry, text_delta*]* (the call failed in a way worth retrying: after the wait it is repeated whole)
        message_end (assistant)
        [compaction_start, compaction_end, message_end (assistant)] (refused for length: compact, ask once more)
        [tool_start, tool_update*, tool_end]* (parallel calls interleave; each call's own events keep this order)
        message_end (tool result, one per call, in the order the model issued the calls)
    turn_end
    ... more turns ...
    agent_end (always last, exactly once, also after errors and cancel)

A job with a check (`--check`) has two more events, from its runner, after agent_end: check_start, check_end.

control (steer, follow-up, pause, resume, cancel from outside the loop) comes at any point: `sent` when it reaches the
agent, then `received` when the loop takes it in (a message joins the conversation just before the message_end that
carries it; the loop holds, goes on, or stops). A control's `sent` always comes before its `received`.

Threads: the sink is called from the loop's thread, and tool_start/tool_update/tool_end also from tool threads,
and a control's `sent` from whichever thread sent it (or the next one to emit), but never concurrently: the agent
serialises every call. A sink must be quick and must not raise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

from pid.messages import AssistantMessage, Message, ToolResultMessage, Usage


@dataclass
class AgentStart:
    type: Literal["agent_start"] = field(default="agent_start", init=False)


@dataclass
class TurnStart:
    turn: int
    type: Literal["turn_start"] = field(default="turn_start", init=False)


@dataclass
class TextDelta:
    """A piece of the assistant's text, as it streams (for live views; the whole reply follows in message_end).
    `attempt` counts the model calls of this turn: after a model_retry the reply streams again from its start."""
    turn: int
    text: str
    attempt: int = 1
    type: Literal["text_delta"] = field(default="text_delta", init=False)


@dataclass
class ModelRetry:
    """The model call failed in a way worth retrying (rate limit, overload, server error, broken connection or
    stream); pid waits `wait_s`, then repeats the whole call. The text deltas this turn streamed so far are void:
    a live view drops them (the retried call's deltas carry attempt + 1). Nothing of the failed attempt reaches the
    transcript."""
    turn: int
    attempt: int               # the attempt that failed (1: the first)
    wait_s: float
    reason: str                # "rate limited", "overloaded", "server error", ... (pid/providers/retry.py)
    status: int | None         # the HTTP status, when there was one
    error: str
    type: Literal["model_retry"] = field(default="model_retry", init=False)

    def describe(self) -> str:
        """'rate limited, retrying in 12 s' (a backoff's wait can be near nothing: 'retrying at once')."""
        if self.wait_s < 0.05:
            return f"{self.reason}, retrying at once"
        wait = f"{self.wait_s:.1f} s" if self.wait_s < 10 else f"{self.wait_s:.0f} s"
        return f"{self.reason}, retrying in {wait}"


@dataclass
class MessageEnd:
    message: Message
    type: Literal["message_end"] = field(default="message_end", init=False)


@dataclass
class ToolStart:
    call_id: str
    name: str
    arguments: dict[str, Any]
    type: Literal["tool_start"] = field(default="tool_start", init=False)


@dataclass
class ToolUpdate:
    """New output of a running call since its last update (a delta; pi sends the accumulated text), throttled."""
    call_id: str
    name: str
    partial: str
    type: Literal["tool_update"] = field(default="tool_update", init=False)


@dataclass
class ToolEnd:
    call_id: str
    name: str
    result: ToolResultMessage
    duration_s: float
    type: Literal["tool_end"] = field(default="tool_end", init=False)


@dataclass
class TurnEnd:
    turn: int
    message: AssistantMessage
    tool_results: list[ToolResultMessage]
    type: Literal["turn_end"] = field(default="turn_end", init=False)


@dataclass
class CompactionStart:
    """The context is being compacted (pid/compaction.py): `threshold` (it would no longer fit) or `overflow` (the
    provider refused a request for its length; the call is retried once after)."""
    reason: str
    tokens: int                          # the context's size, by the job's count
    type: Literal["compaction_start"] = field(default="compaction_start", init=False)


@dataclass
class CompactionEnd:
    reason: str
    tokens_before: int
    tokens_after: int | None = None      # None when it failed
    summarized: int = 0                  # messages summarised
    summary: str | None = None
    error: str | None = None
    will_retry: bool = False             # the refused call is sent again
    usage: Usage = field(default_factory=Usage)   # the summary calls' (already in the job's totals)
    type: Literal["compaction_end"] = field(default="compaction_end", init=False)


@dataclass
class Notice:
    """Something the person running the job should know that is not an error (e.g. a model not in the table)."""
    text: str
    level: Literal["warning", "info"] = "warning"
    type: Literal["notice"] = field(default="notice", init=False)


ControlKind = Literal["steer", "follow_up", "pause", "resume", "cancel"]


@dataclass
class Control:
    """A control from outside the loop (`pid steer`, `follow-up`, `pause`, `resume`, `cancel`, Ctrl-C): `sent` when it
    reaches the agent, `received` when the loop acts on it. `text`: a steer's or follow-up's message, or why a cancel
    that is not the user's was sent (its worker stopping)."""
    kind: ControlKind
    stage: Literal["sent", "received"]
    text: str | None = None
    type: Literal["control"] = field(default="control", init=False)


@dataclass
class AgentEnd:
    status: str
    exit_reason: str
    type: Literal["agent_end"] = field(default="agent_end", init=False)


@dataclass
class CheckStart:
    """The job's check (`--check CMD`) starts, after the agent ended (the runner's event, not the loop's)."""
    command: str
    type: Literal["check_start"] = field(default="check_start", init=False)


@dataclass
class CheckEnd:
    """The check ended: `check` is what result.json records of it (worker/check.py: Check.to_result)."""
    check: dict[str, Any]
    type: Literal["check_end"] = field(default="check_end", init=False)


Event = Union[AgentStart, TurnStart, TextDelta, ModelRetry, MessageEnd, ToolStart, ToolUpdate, ToolEnd, TurnEnd,
              CompactionStart, CompactionEnd, Notice, Control, AgentEnd, CheckStart, CheckEnd]
EventSink = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The default sink."""
