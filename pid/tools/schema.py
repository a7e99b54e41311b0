"""JSON-schema validation with safe coercion.

Only the subset tools use is supported: type (string, integer, number, boolean, array, object, null), properties,
required, items, enum, minimum, exclusiveMinimum, maximum, exclusiveMaximum, minItems. Models often send "5" for 5,
"true" for true, or an array serialised as a JSON string; those are coerced before checking, nothing riskier is.
"""
from __future__ import annotations

import json
import re
from typing import Any

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT_RE = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")

ValidationError = tuple[str, str]  # (path like "edits/0/oldText" or "root", problem)


# ---------------------------------------------------------------- validation

def validate(schema: dict[str, Any], value: Any) -> tuple[Any, list[ValidationError]]:
    """Coerce then check `value`; returns the coerced copy and the problems found (empty when valid)."""
    errors: list[ValidationError] = []
    return _check(schema, value, "", errors), errors


# How the errors of a call refused before it ran begin (their reason first, not an ending: the CLI's one line for
# a failed call, pid/event_records.py): arguments the tool refused, and the registry's own (pid/tools/registry.py:
# arguments that are no JSON, or too big), whose first line also says NOT_RUN.
VALIDATION_FAILED = "Validation failed for tool"
NOT_RUN = "so the tool was not run"
REFUSED_OPENINGS = ('The arguments for tool "', 'Argument "')


def format_validation_error(tool_name: str, errors: list[ValidationError], received: Any) -> str:
    lines = [f'{VALIDATION_FAILED} "{tool_name}":']
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
