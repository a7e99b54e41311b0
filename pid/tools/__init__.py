"""The tool registry and the four built-ins (read, bash, edit, write)."""
from pid.tools.base import Tool, ToolContext, ToolResult, ToolSettings
from pid.tools.registry import ToolRegistry, default_registry

__all__ = ["Tool", "ToolContext", "ToolRegistry", "ToolResult", "ToolSettings", "default_registry"]
