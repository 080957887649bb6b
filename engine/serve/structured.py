"""Tools and structured output at the server's edge: an OpenAI request's messages,
`tools`, `tool_choice`, `parallel_tool_calls` and `response_format` into the engine's
`Prompt` and `Constraint` (`engine.formats.tool_calls`), with every part checked first,
and the engine's tool calls back into OpenAI's shapes.

A JSON schema the grammar engine cannot compile (a tool's parameters, a response
format's schema) is refused here with a 400 naming that part of the request, before
the engine sees it: an answer is never served unconstrained in its place.
"""

from __future__ import annotations

from typing import Any

from engine.errors import StudioError
from engine.formats.templates import Message, ToolCall
from engine.formats.tool_calls import Constraint, Tool
from engine.runtime import constraint as grammar_engine
from engine.runtime import messages as m
from engine.serve import schemas
from engine.serve.errors import ApiError


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, param, "invalid_value")


def response_constraint(body: Any) -> tuple[str, dict[str, Any] | None]:
    """`response_format` as (kind, schema); the schema checked."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return "text", None
    if fmt.type == "json_object":
        return "json_object", None
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise _invalid("response_format json_schema needs json_schema.schema",
                       "response_format.json_schema.schema")
    schema = fmt.json_schema.schema_
    error = grammar_engine.schema_error(schema)
    if error:
        raise ApiError(400, f"response_format.json_schema.schema cannot be compiled to a "
                       f"grammar, so it cannot be enforced: {error}",
                       "response_format.json_schema.schema", "invalid_schema")
    return "json_schema", schema


def chat_request(body: schemas.ChatCompletionRequest) -> tuple[m.Prompt, Constraint | None]:
    """The prompt (messages with their tool calls and results, the tools) and the
    constraint of a chat completion request."""
    kind, schema = response_constraint(body)
    choice = body.choice()
    tools: list[Tool] = []
    for i, tool in enumerate(body.tools or ()):
        params = tool.function.parameters
        if params is not None:
            error = grammar_engine.schema_error(params)
            if error:
                raise ApiError(400, f"tools[{i}].function.parameters cannot be compiled to a "
                               f"grammar, so calls to {tool.function.name} cannot be "
                               f"enforced: {error}", f"tools.{i}.function.parameters",
                               "invalid_schema")
        tools.append(Tool(tool.function.name, tool.function.description or "", params))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise _invalid("two tools have the same name", "tools")
    if choice not in (None, "none", "auto") and not tools:
        raise _invalid(f"tool_choice {choice!r} needs tools", "tool_choice")
    if choice not in (None, "none", "auto", "required") and choice not in names:
        raise _invalid(f"tool_choice names {choice!r}, which is not one of the tools",
                       "tool_choice")
    prompt = m.Prompt(messages=tuple(_messages(body.messages)), chat=True,
                      tools=tuple(tools) if tools and choice != "none" else None)
    wanted = Constraint(tool_choice=choice if tools else None,
                        parallel_tool_calls=body.parallel_tool_calls is not False,
                        response_format=kind, schema=schema)
    return prompt, wanted if wanted.active or prompt.tools else None


def completion_constraint(body: schemas.CompletionRequest) -> Constraint | None:
    kind, schema = response_constraint(body)
    return None if kind == "text" else Constraint(response_format=kind, schema=schema)


def _messages(items: list[schemas.ChatMessage]) -> list[Message]:
    names: dict[str, str] = {}  # call id -> tool name, from the assistants' calls
    out = []
    for i, msg in enumerate(items):
        role = "system" if msg.role == "developer" else msg.role
        calls = None
        if msg.tool_calls:
            if role != "assistant":
                raise _invalid(f"messages[{i}]: only an assistant message has tool_calls",
                               f"messages.{i}.tool_calls")
            calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments)
                          for c in msg.tool_calls)
            names.update((c.id, c.name) for c in calls)
        if role == "tool":
            if msg.tool_call_id is None:
                raise _invalid(f"messages[{i}]: a tool message needs the tool_call_id it "
                               "answers", f"messages.{i}.tool_call_id")
            out.append(Message("tool", msg.text(), tool_call_id=msg.tool_call_id,
                               name=msg.name or names.get(msg.tool_call_id)))
            continue
        out.append(Message(role, msg.text(), tool_calls=calls))
    return out


def message(result: Any) -> tuple[dict[str, Any], bool]:
    """A finished answer as OpenAI's assistant message; whether it made tool calls."""
    if not result.tool_calls:
        text = result.content if result.content is not None else result.text
        return {"role": "assistant", "content": text}, False
    content = result.content if result.content and result.content.strip() else None
    return {"role": "assistant", "content": content,
            "tool_calls": [call_dict(c) for c in result.tool_calls]}, True


def call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class StreamedCalls:
    """What a stream has sent of each tool call, so the end adds only what is missing."""

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}  # index -> characters of arguments sent

    def deltas(self, pieces: tuple[Any, ...]) -> list[dict[str, Any]]:
        out = []
        for piece in pieces:
            if piece.id is not None:
                self.sent[piece.index] = 0
                out.append({"index": piece.index, "id": piece.id, "type": "function",
                            "function": {"name": piece.name, "arguments": piece.arguments}})
            elif piece.arguments:
                out.append({"index": piece.index, "function": {"arguments": piece.arguments}})
            self.sent[piece.index] = self.sent.get(piece.index, 0) + len(piece.arguments)
        return out

    def rest(self, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
        """The deltas the finished calls still need."""
        out = []
        for index, call in enumerate(calls):
            if index not in self.sent:
                out.append({"index": index, **call_dict(call)})
            elif len(call.arguments) > self.sent[index]:
                out.append({"index": index, "function": {
                    "arguments": call.arguments[self.sent[index]:]}})
        return out


def studio_error(exc: StudioError) -> ApiError:
    return ApiError(400, exc.message, None, "invalid_value")
