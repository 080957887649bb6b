"""The typed requests of the OpenAI-compatible endpoints (pydantic models), in the style
of llama-cpp-python's server: every field we support is declared with its bounds, and
anything else is refused by name instead of being silently ignored.

Fields OpenAI defines but we cannot honour (`n` other than 1, penalties other than 0,
`echo`, the legacy `functions`, ...) are refused with a 400 naming the field; a few that
change nothing (`user`, `n: 1`, zero penalties, a text response format) are accepted.
Tools (`tools`, `tool_choice`, `parallel_tool_calls`, `tool` messages, assistant
`tool_calls`) and `response_format` `json_object` / `json_schema` are served: see
docs/serving.md and `engine.formats.tool_calls`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.serve.errors import ApiError

MAX_STOP = 16
MAX_MESSAGES = 4096

# Accepted only with these values (they are OpenAI's defaults and change nothing here).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1, None), "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
    "best_of": (1, None), "echo": (False, None), "suffix": (None, ""),
    "logit_bias": (None, {}), "functions": (None, []),
    "function_call": (None, "none"), "service_tier": (None, "auto", "default"),
    "store": (None, False), "metadata": (None, {}),
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class TextPart(Strict):
    type: Literal["text"]
    text: str


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
CallId = Annotated[str, Field(min_length=1, max_length=200)]


class FunctionCall(Strict):
    name: Name
    arguments: Annotated[str, Field(max_length=1 << 20)]


class ToolCallIn(Strict):
    """A call an assistant made, sent back in the conversation."""

    id: CallId
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=128)] | None = None
    tool_call_id: CallId | None = None
    # What the official client sends back of an assistant message it received.
    refusal: str | None = None
    annotations: list[Any] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(Strict):
    name: Name
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(Strict):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: Name


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
Stop = str | Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                       Field(max_length=MAX_STOP)]


class Common(Strict):
    """What both endpoints take."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Extensions llama-server also takes.
    top_k: Annotated[int, Field(ge=0, le=100000)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0.5, le=5.0)] | None = None
    # OpenAI's fields accepted only with their neutral value (see NEUTRAL).
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if messages[-1].role == "assistant":
            raise ValueError("the last message must not be the assistant's (we do not "
                             "continue a partial answer)")
        return messages

    def choice(self) -> str | None:
        """tool_choice as the engine's Constraint takes it (a named function: its name;
        tools without a choice: "auto"; no tools: None)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        if self.tool_choice is None:
            return "auto" if self.tools else None
        return self.tool_choice

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def alternatives(self) -> int:
        """Top alternatives per token the engine reports (0: none asked)."""
        if not self.logprobs:
            return 0
        return max(self.top_logprobs or 0, 1)


class CompletionRequest(Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    response_format: ResponseFormat | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def token_limit(self) -> int | None:
        return self.max_tokens

    def alternatives(self) -> int:
        return 0 if self.logprobs is None else max(self.logprobs, 1)


def parse(model: type[Strict], data: Any) -> Any:
    """Validate a request body; a 400 naming the first bad field otherwise."""
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or None
        if error["type"] == "extra_forbidden":
            raise ApiError(400, f"unsupported field {field!r}: Variant Studio's server does not "
                           "take it", field, "unsupported_field") from None
        raise ApiError(400, f"invalid {field}: {error['msg']}", field,
                       "invalid_value") from None
    for field, allowed in NEUTRAL.items():
        if field in model.model_fields and getattr(request, field) not in allowed:
            what = {"n": "n other than 1 (one choice per request)",
                    "tools": "tools (no tool calling)", "functions": "functions",
                    "tool_choice": "tool_choice", "function_call": "function_call"}.get(
                field, f"{field} {getattr(request, field)!r}")
            raise ApiError(400, f"unsupported: {what}", field, "unsupported_field")
    if getattr(request, "top_logprobs", None) and not getattr(request, "logprobs", False):
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs",
                       "invalid_value")
    return request
