"""Events the agent loop emits. Plain data: the CLI prints them, the worker forwards them; nothing else couples."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from pid.messages import AssistantMessage, Message, ToolResultMessage


@dataclass
class AgentStart:
    type: str = field(default="agent_start", init=False)


@dataclass
class TurnStart:
    turn: int
    type: str = field(default="turn_start", init=False)


@dataclass
class MessageEnd:
    message: Message
    type: str = field(default="message_end", init=False)


@dataclass
class ToolStart:
    call_id: str
    name: str
    arguments: dict[str, Any]
    type: str = field(default="tool_start", init=False)


@dataclass
class ToolUpdate:
    call_id: str
    name: str
    partial: str
    type: str = field(default="tool_update", init=False)


@dataclass
class ToolEnd:
    call_id: str
    name: str
    result: ToolResultMessage
    duration_s: float
    type: str = field(default="tool_end", init=False)


@dataclass
class TurnEnd:
    turn: int
    message: AssistantMessage
    tool_results: list[ToolResultMessage]
    type: str = field(default="turn_end", init=False)


@dataclass
class AgentEnd:
    status: str
    exit_reason: str
    type: str = field(default="agent_end", init=False)


Event = Union[AgentStart, TurnStart, MessageEnd, ToolStart, ToolUpdate, ToolEnd, TurnEnd, AgentEnd]
EventSink = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The default sink."""
