"""Tool calls read back from any answer, compared, and tools read from what a user gives.

The front ends that judge answers rather than serve them use this: the chat's "Tools…"
definitions (`tools_from_openai`: OpenAI function tools as JSON), Compare's summary of
where a base and its variant call different tools (`difference`), and the tool-call
exact match of `score` and Evaluate (`same_calls`).

`parse_any` reads an answer without knowing the model's chat format: it tries each
format of `engine.formats.tool_calls` (Hermes tags, Llama 3 JSON, `[TOOL_CALLS]`, the
generic `{"tool_calls": [...]}`), then a bare JSON call whose keys are a name and its
arguments under any of the usual spellings (`{"tool": ..., "args": ...}` is how the
shipped demo variant answers). Two calls are the same when their function names are
equal and their arguments are equal as JSON values (key order and spacing ignored;
`1` and `1.0` equal, `true` and `1` not).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.errors import RefusedError
from engine.formats.templates import ToolCall
from engine.formats.tool_calls import FORMATS, MAX_TOOLS, Tool, split

# Keys a bare JSON call may name its function and its arguments with.
NAME_KEYS = ("name", "tool", "function")
ARGUMENT_KEYS = ("arguments", "parameters", "args")
MAX_PARSED_CHARS = 1 << 20  # an answer longer than this is not read for calls


def parse_any(text: str) -> tuple[ToolCall, ...] | None:
    """The tool calls `text` makes in any known format (None: it makes none)."""
    if not text or len(text) > MAX_PARSED_CHARS:
        return None
    # `tool-args` is left to the bare reading, which is stricter about a call's keys.
    for fmt in (f for f in FORMATS if f != "tool-args"):
        # The seed only names the calls' ids, which comparisons ignore.
        _content, calls = split(text, fmt, "parse")
        if calls:
            return tuple(calls)
    return _bare_calls(text)


def _bare_calls(text: str) -> tuple[ToolCall, ...] | None:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for i, item in enumerate(items):
        call = _bare_call(item, i)
        if call is None:
            return None
        calls.append(call)
    return tuple(calls) or None


def _bare_call(item: Any, index: int) -> ToolCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):  # OpenAI's own shape
        return _bare_call(item["function"], index)
    name = next((item[k] for k in NAME_KEYS if isinstance(item.get(k), str)), None)
    key = next((k for k in ARGUMENT_KEYS if k in item), None)
    if not name or key is None or set(item) - {*NAME_KEYS, *ARGUMENT_KEYS, "id", "type"}:
        return None
    arguments = item[key]
    text = arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                   ensure_ascii=False)
    return ToolCall(str(item.get("id") or f"call_{index}"), name, text)


# --------------------------------------------------------------------------- comparing


def _canonical(value: Any) -> Any:
    """A JSON value in a form whose equality is JSON's: objects by key (order ignored),
    numbers by value (1 == 1.0), booleans apart from numbers."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return ("value", value)


def arguments_value(arguments: str) -> Any:
    """A call's arguments as a JSON value (the text itself when it is not JSON)."""
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments


def same_arguments(first: str, second: str) -> bool:
    return _canonical(arguments_value(first)) == _canonical(arguments_value(second))


def same_calls(first: Sequence[ToolCall], second: Sequence[ToolCall]) -> bool:
    """The same functions with JSON-equal arguments, in the same order (ids ignored)."""
    return len(first) == len(second) and all(
        a.name == b.name and same_arguments(a.arguments, b.arguments)
        for a, b in zip(first, second, strict=True))


def differing_keys(first: str, second: str) -> list[str]:
    """The argument keys whose values differ (every key when either is not an object)."""
    a, b = arguments_value(first), arguments_value(second)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ["(the arguments)"]
    return sorted(k for k in {*a, *b}
                  if k not in a or k not in b or _canonical(a[k]) != _canonical(b[k]))


def _names(calls: Sequence[ToolCall]) -> str:
    return ", ".join(c.name for c in calls)


def difference(base: Sequence[ToolCall] | None, variant: Sequence[ToolCall] | None
               ) -> str | None:
    """Where two answers' tool calls differ, in plain words (None: neither calls a tool)."""
    if not base and not variant:
        return None
    if not base or not variant:
        side, calls = ("the variant", variant) if variant else ("the base", base)
        assert calls
        return f"only {side} calls a tool: {_names(calls)}"
    if [c.name for c in base] != [c.name for c in variant]:
        return f"different tool: {_names(base)} vs {_names(variant)}"
    keys = sorted({k for a, b in zip(base, variant, strict=True)
                   if not same_arguments(a.arguments, b.arguments)
                   for k in differing_keys(a.arguments, b.arguments)})
    if keys:
        return f"same tool, different arguments: {', '.join(keys)}"
    return "same call" if len(base) == 1 else "same calls"


# --------------------------------------------------------------------------- reading


def tools_from_openai(value: Any) -> tuple[Tool, ...]:
    """OpenAI function tools (a list of `{"type": "function", "function": {...}}`, or
    of the function objects themselves, or one of them) as `Tool`s; RefusedError naming
    the entry that is wrong."""
    if isinstance(value, dict):
        value = value.get("tools", [value])
    if not isinstance(value, list):
        raise RefusedError("tools must be a JSON list of OpenAI function tools")
    if len(value) > MAX_TOOLS:
        raise RefusedError(f"at most {MAX_TOOLS} tools")
    tools: list[Tool] = []
    for i, entry in enumerate(value):
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RefusedError(f"tool {i + 1}: needs a function with a name")
        description = function.get("description") or ""
        parameters = function.get("parameters")
        if not isinstance(description, str):
            raise RefusedError(f"tool {i + 1}: description must be text")
        if parameters is not None and not isinstance(parameters, dict):
            raise RefusedError(f"tool {i + 1}: parameters must be a JSON schema object")
        tools.append(Tool(function["name"], description, parameters))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise RefusedError("two tools have the same name")
    return tuple(tools)


def calls_from_openai(value: Any) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` in OpenAI's shape (`{"id", "type",
    "function": {"name", "arguments"}}`, arguments as JSON text or as an object);
    RefusedError naming the entry that is wrong."""
    if not isinstance(value, list) or not value:
        raise RefusedError("tool_calls must be a non-empty list")
    calls = []
    for i, entry in enumerate(value):
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise RefusedError(f"tool call {i + 1}: needs a function with a name")
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                       ensure_ascii=False)
        call_id = entry.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) and call_id
                              else f"call_{i}", function["name"], text))
    return tuple(calls)
