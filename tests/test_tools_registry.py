"""Schema validation and coercion, and ToolRegistry.execute never raising."""
from __future__ import annotations

import json

import pytest

from pid.messages import TextContent, ToolCall, ToolSpec
from pid.sandbox_api import SandboxError
from pid.tools import Tool, ToolContext, ToolRegistry, ToolResult, default_registry
from pid.tools.schema import validate


class NoSandbox:
    """Registry tests never reach a sandbox; any use of one is a bug."""
    workdir = "/nowhere"

    def exec(self, *a, **k):
        raise AssertionError("sandbox used")

    read_file = write_file = exec


def ctx() -> ToolContext:
    return ToolContext(NoSandbox())  # type: ignore[arg-type]


def run(registry: ToolRegistry, name: str, args: dict, raw: str | None = None) -> ToolResult:
    return registry.execute(ToolCall("c1", name, args, raw_arguments=raw), ctx())


def text(result: ToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


# ---------------------------------------------------------------- validation

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "count": {"type": "integer", "minimum": 1},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "edits": {"type": "array", "minItems": 1, "items": {
            "type": "object", "properties": {"oldText": {"type": "string"}, "newText": {"type": "string"}},
            "required": ["oldText", "newText"]}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
    },
    "required": ["path"],
}


def test_valid_arguments_pass_unchanged():
    args = {"path": "a", "count": 3, "ratio": 0.5, "flag": False, "mode": "fast", "extra": [1]}
    assert validate(SCHEMA, args) == (args, [])


def test_safe_coercions():
    value, errors = validate(SCHEMA, {"path": "a", "count": "5", "ratio": "0.25", "flag": "true",
                                      "edits": '[{"oldText": "x", "newText": "y"}]', "opts": '{"depth": "2"}'})
    assert errors == []
    assert value == {"path": "a", "count": 5, "ratio": 0.25, "flag": True,
                     "edits": [{"oldText": "x", "newText": "y"}], "opts": {"depth": 2}}
    assert validate(SCHEMA, {"path": "a", "count": 7.0})[0]["count"] == 7
    assert validate(SCHEMA, {"path": "a", "flag": "false"})[0]["flag"] is False


def test_no_unsafe_coercions():
    _, errors = validate(SCHEMA, {"path": 5, "count": "5.5", "flag": "yes", "edits": "not json", "ratio": True})
    assert errors == [("path", "must be string"), ("count", "must be integer"), ("flag", "must be boolean"),
                      ("edits", "must be array"), ("ratio", "must be number")]


def test_bounds_enum_items_and_nested_required():
    _, errors = validate(SCHEMA, {"path": "a", "count": 0, "ratio": 0, "mode": "medium",
                                  "edits": [{"oldText": "x"}, {"oldText": 1, "newText": "y"}]})
    assert errors == [
        ("count", "must be >= 1"),
        ("ratio", "must be > 0"),
        ("mode", 'must be equal to one of the allowed values: "fast", "slow"'),
        ("edits/0/newText", "must have required property 'newText'"),
        ("edits/1/oldText", "must be string"),
    ]
    assert validate(SCHEMA, {"path": "a", "ratio": 1.5})[1] == [("ratio", "must be <= 1")]
    assert validate(SCHEMA, {"path": "a", "edits": []})[1] == [("edits", "must NOT have fewer than 1 items")]


def test_null_means_absent():
    assert validate(SCHEMA, {"path": "a", "count": None}) == ({"path": "a"}, [])
    assert validate(SCHEMA, {"path": None})[1] == [("path", "must have required property 'path'")]


def test_validation_message_format_exactly():
    registry = default_registry()
    result = run(registry, "bash", {"timeout": "soon"})
    assert result.is_error
    assert text(result) == (
        'Validation failed for tool "bash":\n'
        "  - timeout: must be number\n"
        "  - command: must have required property 'command'\n"
        "\n"
        "Received arguments:\n"
        '{\n  "timeout": "soon"\n}')


def test_bash_timeout_bounds_are_validation_errors():
    registry = default_registry()
    zero = run(registry, "bash", {"command": "true", "timeout": 0})
    assert text(zero) == ('Validation failed for tool "bash":\n  - timeout: must be > 0\n\n'
                          'Received arguments:\n{\n  "command": "true",\n  "timeout": 0\n}')
    over = run(registry, "bash", {"command": "true", "timeout": 601})
    assert "  - timeout: must be <= 600\n" in text(over)


# ---------------------------------------------------------------- registry

def echo_tool(name: str = "echo") -> Tool:
    return Tool(name, "Echo.", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                lambda c, a: ToolResult.text(f"n={a['n']!r}"))


def test_unknown_tool():
    result = run(ToolRegistry([echo_tool()]), "nope", {})
    assert result.is_error and text(result) == "Tool nope not found"


def test_coercion_reaches_the_handler():
    assert text(run(ToolRegistry([echo_tool()]), "echo", {"n": "5"})) == "n=5"


def test_invalid_json_arguments_are_quoted_and_truncated():
    registry = ToolRegistry([echo_tool()])
    short = run(registry, "echo", {}, raw='{"n": 5')
    assert short.is_error
    assert "not valid JSON" in text(short) and text(short).endswith('Received:\n{"n": 5')
    long = text(run(registry, "echo", {}, raw='{"n": "' + "x" * 5000))
    assert "[truncated, 5007 characters total]" in long and len(long) < 2400
    listed = text(run(registry, "echo", {}, raw="[1, 2]"))   # (valid JSON: "not valid JSON" misled the model)
    assert listed.startswith('The arguments for tool "echo" were JSON, but not one JSON object, ')


def test_handler_exceptions_become_error_results():
    def boom(c, a):
        raise SandboxError("container is gone")

    def bare(c, a):
        raise KeyError

    registry = ToolRegistry([Tool("boom", "", {"type": "object"}, boom), Tool("bare", "", {"type": "object"}, bare)])
    assert (run(registry, "boom", {}).is_error, text(run(registry, "boom", {}))) == (True, "container is gone")
    assert text(run(registry, "bare", {})) == "KeyError"


def test_registry_names_subset_specs():
    registry = default_registry()
    assert registry.names == ["read", "bash", "edit", "write"]
    sub = registry.subset(["read", "bash"])
    assert sub.names == ["read", "bash"]
    assert all(isinstance(s, ToolSpec) for s in sub.specs())
    with pytest.raises(ValueError, match="known tools: read, bash, edit, write"):
        registry.subset(["read", "grep"])
    with pytest.raises(ValueError):
        registry.register(echo_tool("read"))


def test_builtin_schemas_are_clean_json():
    for spec in default_registry().specs():
        assert json.loads(json.dumps(spec.parameters)) == spec.parameters
        assert spec.parameters["type"] == "object" and spec.description
    bash = default_registry().get("bash")
    assert bash is not None and bash.parameters["properties"]["timeout"]["maximum"] == 600


# ---------------------------------------------------------------- the decorator


def test_arguments_that_are_not_an_object():
    result = run(ToolRegistry([echo_tool()]), "echo", [1, 2])  # type: ignore[arg-type]
    assert text(result) == ('Validation failed for tool "echo":\n  - root: must be object\n\n'
                            "Received arguments:\n[\n  1,\n  2\n]")
