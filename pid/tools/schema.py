"""JSON-schema validation with safe coercion, and schemas built from typed Python signatures.

Only the subset tools use is supported: type (string, integer, number, boolean, array, object, null), properties,
required, items, enum, minimum, exclusiveMinimum, maximum, exclusiveMaximum, minItems. Models often send "5" for 5,
"true" for true, or an array serialised as a JSON string; those are coerced before checking, nothing riskier is.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from typing import Any, Callable, Literal, Union

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT_RE = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")

ValidationError = tuple[str, str]  # (path like "edits/0/oldText" or "root", problem)


# ---------------------------------------------------------------- validation

def validate(schema: dict[str, Any], value: Any) -> tuple[Any, list[ValidationError]]:
    """Coerce then check `value`; returns the coerced copy and the problems found (empty when valid)."""
    errors: list[ValidationError] = []
    return _check(schema, value, "", errors), errors


def format_validation_error(tool_name: str, errors: list[ValidationError], received: Any) -> str:
    lines = [f'Validation failed for tool "{tool_name}":']
    lines += [f"  - {path}: {problem}" for path, problem in errors]
    return "\n".join(lines) + "\n\nReceived arguments:\n" + json.dumps(received, indent=2, default=str)


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _is_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True  # unknown type keyword: do not invent failures


def _coerce(value: Any, kind: str) -> Any:
    """The value converted to `kind` when that is unambiguous, else the value unchanged."""
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            if _INT_RE.match(value):
                return int(value)
            if _FLOAT_RE.match(value) and float(value).is_integer():
                return int(float(value))
    elif kind == "number" and isinstance(value, str):
        if _INT_RE.match(value):
            return int(value)
        if _FLOAT_RE.match(value):
            return float(value)
    elif kind == "boolean" and isinstance(value, str):
        if value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif kind in ("array", "object") and isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if _is_type(parsed, kind):
            return parsed
    return value


def _check(schema: dict[str, Any], value: Any, path: str, errors: list[ValidationError]) -> Any:
    where = path or "root"
    kinds = schema.get("type")
    if kinds is not None:
        kinds_list = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, k) for k in kinds_list):
            for k in kinds_list:
                coerced = _coerce(value, k)
                if _is_type(coerced, k):
                    value = coerced
                    break
            else:
                errors.append((where, f"must be {','.join(kinds_list)}"))
                return value

    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append((where, f"must be equal to one of the allowed values: {allowed}"))

    if _is_type(value, "number"):
        for key, op, ok in (("minimum", ">=", lambda v, m: v >= m), ("exclusiveMinimum", ">", lambda v, m: v > m),
                            ("maximum", "<=", lambda v, m: v <= m), ("exclusiveMaximum", "<", lambda v, m: v < m)):
            if key in schema and not ok(value, schema[key]):
                errors.append((where, f"must be {op} {_num(schema[key])}"))

    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append((where, f"must NOT have fewer than {schema['minItems']} items"))
        if "items" in schema:
            value = [_check(schema["items"], item, f"{path}/{i}" if path else str(i), errors)
                     for i, item in enumerate(value)]

    if isinstance(value, dict) and ("properties" in schema or "required" in schema):
        props: dict[str, Any] = schema.get("properties", {})
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = f"{path}/{key}" if path else key
            if key in props:
                if item is None and not _accepts_null(props[key]):
                    continue  # null for a property means "not given"; `required` below catches required ones
                out[key] = _check(props[key], item, sub, errors)
            else:
                out[key] = item
        for key in schema.get("required", []):
            if key not in out:
                errors.append((f"{path}/{key}" if path else key, f"must have required property '{key}'"))
        value = out
    return value


def _accepts_null(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    return kinds is None or kinds == "null" or (isinstance(kinds, list) and "null" in kinds)


# ---------------------------------------------------------------- schemas from signatures

_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Attributes|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_RE = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(summary, {arg: description}) from a Google-style docstring with an `Args:` (or `Attributes:`) section."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent = 0
    for line in lines:
        m = _SECTION_RE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if m:
            section, current = m.group(1), None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters", "Attributes") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        arg = _ARG_RE.match(line.strip())
        if arg and (current is None or indent <= entry_indent):
            current, entry_indent = arg.group(1).lstrip("*"), indent
            params[current] = arg.group(3).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(summary).strip(), params


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise TypeError(f"unions other than Optional[T] are not supported: {tp!r}")
    return tp, False


def schema_for_type(tp: Any, description: str | None = None) -> dict[str, Any]:
    """The JSON schema for one annotation (str, int, float, bool, list[T], Optional[T], Literal[...], dataclass)."""
    tp, _ = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    schema: dict[str, Any]
    if tp is str:
        schema = {"type": "string"}
    elif tp is bool:
        schema = {"type": "boolean"}
    elif tp is int:
        schema = {"type": "integer"}
    elif tp is float:
        schema = {"type": "number"}
    elif origin is Literal:
        values = list(typing.get_args(tp))
        schema = {}
        if all(isinstance(v, str) for v in values):
            schema["type"] = "string"
        elif all(isinstance(v, bool) for v in values):
            schema["type"] = "boolean"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            schema["type"] = "integer"
        schema["enum"] = values
    elif tp is list or origin is list:
        schema = {"type": "array"}
        args = typing.get_args(tp)
        if args:
            schema["items"] = schema_for_type(args[0])
    elif dataclasses.is_dataclass(tp) and isinstance(tp, type):
        schema = _object_schema(_dataclass_params(tp), parse_docstring(tp.__doc__)[1])
    else:
        raise TypeError(f"unsupported parameter type for a tool: {tp!r}")
    if description:
        schema["description"] = description
    return schema


def _dataclass_params(cls: type) -> list[tuple[str, Any, bool]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, hints[f.name], has_default))
    return out


def _object_schema(params: list[tuple[str, Any, bool]], docs: dict[str, str]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, tp, has_default in params:
        properties[name] = schema_for_type(tp, docs.get(name))
        if not has_default and not _unwrap_optional(tp)[1]:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def signature_schema(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, parameters schema) for `fn(ctx, ...)`: the first parameter is the ToolContext, not a tool arg."""
    summary, docs = parse_docstring(fn.__doc__)
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]
    spec = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: *args/**kwargs cannot be tool parameters")
        if p.name not in hints:
            raise TypeError(f"{fn.__name__}: parameter {p.name!r} needs a type annotation")
        spec.append((p.name, hints[p.name], p.default is not p.empty))
    return summary, _object_schema(spec, docs)


def build_value(tp: Any, value: Any) -> Any:
    """Turn validated JSON into the annotated Python value (dicts into dataclasses, recursively)."""
    if value is None:
        return None
    tp, _ = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and isinstance(value, dict):
        kwargs = {name: build_value(ftp, value[name]) for name, ftp, _ in _dataclass_params(tp) if name in value}
        return tp(**kwargs)
    if typing.get_origin(tp) is list and isinstance(value, list):
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [build_value(item_tp, v) for v in value]
    if tp is float and isinstance(value, int):
        return float(value)
    return value
