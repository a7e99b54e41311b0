"""The tool registry and the four built-ins (read, bash, edit, write)."""
from pid.tools.base import ToolContext, ToolResult, ToolSettings
from pid.tools.registry import Tool, ToolRegistry, default_registry

__all__ = ["Tool", "ToolContext", "ToolRegistry", "ToolResult", "ToolSettings", "default_registry"]
