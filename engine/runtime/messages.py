"""The engine's typed messages: every request it takes and every event it sends.

Front ends (the window, the CLI, the local server, tests) build requests here (most
through `engine.runtime.assembly`) and hand them to `EngineClient.submit`; the host
decodes them here and dispatches by type, so a request has one shape everywhere. On
the wire a request is `{"id", "op", "params"}` (see `engine.runtime.protocol`);
`to_params` / `decode_request` convert, through the one checker of `engine.wire`
(each field's type and bounds are its hint). A malformed request is refused
(RefusedError) before any handler runs; a request built in-process with a wrong value
is refused where it is built.

Events: `Token` and `Progress` while a request runs, then exactly one of `Finished`
(with the request's typed result, `RESULT`: `engine.runtime.results`), `Failed` (a
typed error) or `Cancelled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from engine import wire
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import RefusedError, StudioError
from engine.formats.templates import CHAT_ROLES, Message, ToolCall
from engine.formats.tool_calls import MAX_TOOLS, CallDelta, Constraint, Tool
from engine.runtime import protocol
from engine.runtime.results import (
    CompareResult,
    CrossCheckResult,
    EngineStatus,
    GenerationResult,
    ScoreResult,
)

MAX_MESSAGES = 4096
MAX_CROSS_CHECK_PROMPTS = 64
MAX_CROSS_CHECK_TOKENS = 256
MAX_TOP_LOGPROBS = 20
MAX_SCORE_ITEMS = 100_000
SCORE_KINDS = ("text", "pair", "chat")


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Prompt(wire.Wire):
    """What to generate from: raw text, or chat messages rendered by the template."""

    text: str | None = None
    messages: Annotated[tuple[Message, ...], wire.Size(0, MAX_MESSAGES)] = ()
    chat: bool = False
    system: str | None = None
    # Tools the model may call (`engine.formats.tool_calls`), rendered into the prompt.
    tools: tuple[Tool, ...] | None = field(default=None, metadata=wire.OMIT_NONE)

    def __post_init__(self) -> None:
        wire.check(self)
        if any(m.role not in CHAT_ROLES for m in self.messages):
            raise RefusedError("each message needs a role (system, user, assistant or "
                               "tool) and text content")
        if self.tools is not None and len(self.tools) > MAX_TOOLS:
            raise RefusedError(f"at most {MAX_TOOLS} tools")


# --------------------------------------------------------------------------- requests


class Request:
    """Base of the engine's requests: `OP` names it on the wire, `RESULT` is the type of
    what it finishes with (None: a plain JSON value)."""

    OP: ClassVar[str]
    RESULT: ClassVar[type[wire.Wire] | None] = None

    def to_params(self) -> dict[str, Any]:
        return wire.encode_fields(self)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Request:
        return wire.decode(cls, params)

    @classmethod
    def decode_result(cls, raw: Any) -> Any:
        """The typed result of a `finished` event for this request."""
        return raw if cls.RESULT is None else cls.RESULT.from_dict(raw)


@dataclass(frozen=True)
class Ping(Request):
    """Is the engine there? (answers `{"pid"}`)"""

    OP: ClassVar[str] = "ping"


@dataclass(frozen=True)
class Describe(Request):
    """Resident bases, sessions (identity, adapters, memory), threads."""

    OP: ClassVar[str] = "describe"
    RESULT: ClassVar[type[wire.Wire] | None] = EngineStatus


@dataclass(frozen=True)
class CloseAll(Request):
    """Close every session and resident (answers `{}`)."""

    OP: ClassVar[str] = "close_all"


@dataclass(frozen=True)
class Abort(Request):
    """Test hook (VARIANT_STUDIO_TEST_HOOKS=1): the engine aborts, as a native crash."""

    OP: ClassVar[str] = "abort"


@dataclass(frozen=True)
class Open(Request):
    """Warm a session: load the base and the adapters, create the context."""

    OP: ClassVar[str] = "open"
    RESULT: ClassVar[type[wire.Wire] | None] = EngineStatus
    spec: SessionSpec


@dataclass(frozen=True)
class Generate(Request):
    """Generate from `prompt` with the model or variant `spec`; streams `Token`s."""

    OP: ClassVar[str] = "generate"
    RESULT: ClassVar[type[wire.Wire] | None] = GenerationResult
    spec: SessionSpec
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)
    # The most likely alternatives reported per token.
    top_logprobs: Annotated[int, wire.Range(0, MAX_TOP_LOGPROBS)] = 0
    # What the answer must be (a JSON schema, a tool call): a token mask in the sampler.
    constraint: Constraint | None = field(default=None, metadata=wire.OMIT_NONE)

    def __post_init__(self) -> None:
        wire.check(self)


@dataclass(frozen=True)
class Compare(Generate):
    """The variant `spec` and its base, same prompt and sampling, side by side."""

    OP: ClassVar[str] = "compare"
    RESULT: ClassVar[type[wire.Wire] | None] = CompareResult


@dataclass(frozen=True)
class CrossCheck(Request):
    """The same model or variant on two backends, on the same token ids."""

    OP: ClassVar[str] = "cross_check"
    RESULT: ClassVar[type[wire.Wire] | None] = CrossCheckResult
    first: SessionSpec
    second: SessionSpec
    prompts: Annotated[tuple[Prompt, ...], wire.Size(1, MAX_CROSS_CHECK_PROMPTS)]
    # Tokens decoded per prompt.
    tokens: Annotated[int, wire.Range(1, MAX_CROSS_CHECK_TOKENS)] = 8
    genai: bool = False

    def __post_init__(self) -> None:
        wire.check(self)


@dataclass(frozen=True)
class BuildOpenVino(Request):
    """Build (or find in the cache) the structurally named OpenVINO IR of a GGUF base
    (answers `openvino.build.BuildResult.to_dict()`, read by the catalog step that
    records the build)."""

    OP: ClassVar[str] = "build_openvino"
    source: str

    def __post_init__(self) -> None:
        wire.check(self)


@dataclass(frozen=True)
class ScoreItem(wire.Wire):
    """One item to score, teacher-forced (see `engine.runtime.scoring`).

    `kind` "text": `target` is a whole text, every token but its first scored. "pair":
    `prompt.text` (raw text, not scored) then `target`, the completion. "chat":
    `prompt.messages` rendered with the chat template as served (generation prompt
    included, no profile system prompt added) then `target`, the last assistant turn.
    `line` is where the item came from (1-based; 0 when it came from nowhere).
    `tool_calls`: the calls the answer must make (the data's assistant `tool_calls`;
    `target` is then the answer in the generic format, which scoring rewrites in the
    format the scored model is served in); a target that parses as tool calls is one
    too."""

    kind: Literal["text", "pair", "chat"]
    target: Annotated[str, wire.Size(1, None)]
    prompt: Prompt = field(default_factory=Prompt)
    line: Annotated[int, wire.Range(0, None)] = 0
    tool_calls: tuple[ToolCall, ...] | None = field(default=None, metadata=wire.OMIT_NONE)

    def __post_init__(self) -> None:
        wire.check(self)


@dataclass(frozen=True)
class Score(Request):
    """Teacher-forced log-probabilities of `items` under the model or variant `spec`:
    per token, mean NLL per token and perplexity; with `exact_match`, also whether the
    greedy answer equals each pair's or chat's target. `per_token` includes every
    scored token's log-probability in the result (off for very large sets)."""

    OP: ClassVar[str] = "score"
    RESULT: ClassVar[type[wire.Wire] | None] = ScoreResult
    spec: SessionSpec
    items: Annotated[tuple[ScoreItem, ...], wire.Size(1, MAX_SCORE_ITEMS)]
    exact_match: bool = False
    per_token: bool = True

    def __post_init__(self) -> None:
        wire.check(self)


REQUESTS: dict[str, type[Request]] = {cls.OP: cls for cls in (
    Ping, Describe, CloseAll, Abort, Open, Generate, Compare, CrossCheck, BuildOpenVino,
    Score)}


def decode_request(op: str, params: Any) -> Request:
    """The typed request for a wire message; RefusedError when it is malformed."""
    cls = REQUESTS.get(op)
    if cls is None:
        raise RefusedError(f"unknown engine request {op!r}")
    if not isinstance(params, dict):
        raise RefusedError(f"malformed {op} request: params must be an object")
    try:
        return cls.from_params(params)
    except StudioError as exc:
        # e.g. a sampling setting out of range: refused with its own reason
        raise RefusedError(f"malformed {op} request: {exc.message}") from None


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Token(wire.Wire):
    """One generated token of one side ("main", or "base"/"variant" in a comparison);
    `top` holds the most likely alternatives as (token id, text, logprob) when the
    request asked for them."""

    side: str
    token_id: int
    text: str
    logprob: float
    index: int
    top: tuple[tuple[int, str, float], ...] = ()
    piece: str = ""  # this token's own text (sent with `top`)
    # With tools: the part of `text` that is content (None: all of it) and the pieces of
    # tool calls it completed (`engine.formats.tool_calls.CallParser`).
    content: str | None = None
    calls: tuple[CallDelta, ...] = ()


@dataclass(frozen=True)
class Progress(wire.Wire):
    stage: str
    fraction: float


@dataclass(frozen=True)
class Finished:
    """The request's result: its `RESULT` type once the client has read it."""

    result: Any


@dataclass(frozen=True)
class Failed:
    error: StudioError


@dataclass(frozen=True)
class Cancelled:
    pass


Event = Token | Progress | Finished | Failed | Cancelled
TERMINAL = (Finished, Failed, Cancelled)
ENVELOPE = ("id", "event")


def decode_event(message: dict[str, Any], request: type[Request] | None = None
                 ) -> Event | None:
    """The typed event of an engine message (None for one this client does not know);
    a `finished` result is read as `request`'s result type."""
    kind = message.get("event")
    if kind in ("token", "progress"):
        cls = Token if kind == "token" else Progress
        return wire.decode(cls, {k: v for k, v in message.items() if k not in ENVELOPE},
                           kind, extra=True)
    if kind == "finished":
        raw = message.get("result")
        return Finished(request.decode_result(raw) if request is not None else raw)
    if kind == "failed":
        return Failed(protocol.error_from_payload(message.get("error") or {}))
    if kind == "cancelled":
        return Cancelled()
    return None
