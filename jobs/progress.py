"""A running job's progress as its events tell it (turns, tool calls, usage, what it is doing now): what the worker
writes to the store for `pid status`, and what `pid run`'s live view shows."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from pid import events as ev
from pid.jobs.store import CHECKING, COLLECTING
from pid.messages import AssistantMessage, Usage
from pid.tools.summary import summarize_call


def describe_call(name: str, args: dict[str, Any]) -> str:
    """A tool call in a few words, for `pid status`."""
    return f"{name} {summarize_call(name, args, width=80)}".rstrip()


@dataclass
class Progress:
    """The running attempt as its events tell it. Events come from the agent's thread and its tool threads."""
    turns: int = 0
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    activity: str | None = None
    last_tool: str | None = None
    version: int = 0
    _running: dict[str, str] = field(default_factory=dict)
    _retrying: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, event: ev.Event) -> None:
        with self._lock:
            if isinstance(event, ev.TurnStart):
                self.turns = event.turn
                self._retrying = False
                self.activity = f"turn {event.turn}: waiting for the model"
            elif isinstance(event, ev.MessageEnd) and isinstance(event.message, AssistantMessage):
                self.usage.add(event.message.usage)
            elif isinstance(event, ev.ToolStart):
                self.tool_calls += 1
                self._running[event.call_id] = describe_call(event.name, event.arguments)
                self.activity = f"turn {self.turns}: running {self._running[event.call_id]}"
            elif isinstance(event, ev.ToolEnd):
                call = self._running.pop(event.call_id, event.name)
                mark = "failed" if event.result.is_error else "ok"
                self.last_tool = f"{call} ({mark}, {event.duration_s:.1f}s)"
                still = next(iter(self._running.values()), None)
                self.activity = f"turn {self.turns}: " + (f"running {still}" if still else "tool calls done")
            elif isinstance(event, ev.CompactionStart):
                self.activity = f"turn {self.turns}: compacting the context"
            elif isinstance(event, ev.CompactionEnd):
                self.usage.add(event.usage)
                self.activity = f"turn {self.turns}: waiting for the model"   # compacted (or not): it is asked now
            elif isinstance(event, ev.ModelRetry):
                self.activity = f"turn {event.turn}: {event.describe()} (attempt {event.attempt} failed)"
                self._retrying = True
            elif isinstance(event, ev.TextDelta) and self._retrying:   # a retried call answers: the wait is over
                self._retrying = False
                self.activity = f"turn {event.turn}: the model is answering (attempt {event.attempt})"
            elif isinstance(event, ev.Control) and event.stage == "received" and event.kind in ("pause", "resume"):
                # (a new user's: a held job said "waiting for the model" for as long as it was held)
                self.activity = f"turn {self.turns}: " + ("paused (pid resume lets it go on)" if event.kind == "pause"
                                                          else "resumed")
            elif isinstance(event, ev.AgentEnd):
                self.activity = COLLECTING
            elif isinstance(event, ev.CheckStart):
                self.activity = CHECKING
            elif isinstance(event, ev.CheckEnd):
                self.activity = COLLECTING
            else:
                return
            self.version += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"turns": self.turns, "tool_calls": self.tool_calls, "usage": self.usage.to_result(),
                    "activity": self.activity, "last_tool": self.last_tool}
