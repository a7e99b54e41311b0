"""What a tool is and what it gets when it runs. The registry and the four built-ins build on this."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from pid.messages import ImageContent, TextContent, ToolSpec
from pid.sandbox_api import Sandbox


@dataclass
class ToolSettings:
    bash_timeout_s: float = 120.0       # default when the model gives none
    bash_max_timeout_s: float = 600.0   # a larger `timeout` argument is a validation error


@dataclass
class ToolContext:
    sandbox: Sandbox
    cancel: threading.Event = field(default_factory=threading.Event)
    settings: ToolSettings = field(default_factory=ToolSettings)
    # Partial output of a long-running call, for live views (throttled by the caller of on_update's source).
    on_update: Callable[[str], None] | None = None
    # The full-output files bash's notices named to the model: the sandbox keeps only the newest, and a read of one
    # it removed says so, not just "File not found".
    full_outputs: set[str] = field(default_factory=set)


@dataclass
class ToolResult:
    content: list[Union[TextContent, ImageContent]]
    is_error: bool = False
    details: dict[str, Any] | None = None   # for the session and events, never sent to the model
    timed_out: bool = False                 # lets the loop cap consecutive timed-out commands

    @classmethod
    def text(cls, text: str, *, is_error: bool = False, details: dict[str, Any] | None = None,
             timed_out: bool = False) -> "ToolResult":
        return cls([TextContent(text)], is_error, details, timed_out)

    @classmethod
    def error(cls, text: str) -> "ToolResult":
        return cls([TextContent(text)], True)


Handler = Callable[[ToolContext, dict[str, Any]], ToolResult]


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    handler: Handler
    # Rewrites accepted legacy argument shapes into the current schema before validation (e.g. edit's top-level
    # oldText/newText). Keeps the schema the model sees clean while old habits still work.
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)
