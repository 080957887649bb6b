"""The engine's typed messages: every request it takes and every event it sends.

Front ends (the window, the CLI, the local server, tests) build requests here and hand
them to `EngineClient.submit`; the host decodes them here and dispatches by type, so a
request has one shape everywhere. On the wire a request is `{"id", "op", "params"}`
(see `engine.runtime.protocol`); `to_params` / `decode_request` convert. A malformed
request is refused (RefusedError) before any handler runs.

Events: `Token` and `Progress` while a request runs, then exactly one of `Finished`
(with the result, a JSON object), `Failed` (a typed error) or `Cancelled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import RefusedError, StudioError
from engine.formats.templates import ROLES, Message
from engine.runtime import protocol

MAX_MESSAGES = 4096
MAX_CROSS_CHECK_PROMPTS = 64
MAX_CROSS_CHECK_TOKENS = 256
MAX_TOP_LOGPROBS = 20
MAX_SCORE_ITEMS = 100_000
SCORE_KINDS = ("text", "pair", "chat")


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Prompt:
    """What to generate from: raw text, or chat messages rendered by the template."""

    text: str | None = None
    messages: tuple[Message, ...] = ()
    chat: bool = False
    system: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "chat": self.chat, "system": self.system,
                "messages": [{"role": m.role, "content": m.content} for m in self.messages]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Prompt:
        raw = data.get("messages") or []
        if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
            raise RefusedError(f"messages must be a list of at most {MAX_MESSAGES}")
        messages = []
        for item in raw:
            if not isinstance(item, dict) or item.get("role") not in ROLES or not isinstance(
                    item.get("content"), str):
                raise RefusedError("each message needs a role (system, user or assistant) "
                                   "and text content")
            messages.append(Message(item["role"], item["content"]))
        text, system = data.get("text"), data.get("system")
        if text is not None and not isinstance(text, str):
            raise RefusedError("prompt text must be a string")
        if system is not None and not isinstance(system, str):
            raise RefusedError("system prompt must be a string")
        return Prompt(text, tuple(messages), bool(data.get("chat")), system)


# --------------------------------------------------------------------------- requests


class Request:
    """Base of the engine's requests: `OP` names it on the wire."""

    OP: ClassVar[str]

    def to_params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Request:
        return cls()


@dataclass(frozen=True)
class Ping(Request):
    OP: ClassVar[str] = "ping"


@dataclass(frozen=True)
class Describe(Request):
    """Resident bases, sessions (identity, adapters, memory), threads."""

    OP: ClassVar[str] = "describe"


@dataclass(frozen=True)
class CloseAll(Request):
    OP: ClassVar[str] = "close_all"


@dataclass(frozen=True)
class Abort(Request):
    """Test hook (VARIANT_STUDIO_TEST_HOOKS=1): the engine aborts, as a native crash."""

    OP: ClassVar[str] = "abort"


@dataclass(frozen=True)
class Open(Request):
    """Warm a session: load the base and the adapters, create the context."""

    OP: ClassVar[str] = "open"
    spec: SessionSpec

    def to_params(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Open:
        return cls(SessionSpec.from_dict(params["spec"]))


@dataclass(frozen=True)
class Generate(Request):
    """Generate from `prompt` with the model or variant `spec`; streams `Token`s."""

    OP: ClassVar[str] = "generate"
    spec: SessionSpec
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)
    top_logprobs: int = 0  # the most likely alternatives reported per token (0..20)

    def __post_init__(self) -> None:
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int) or \
                not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RefusedError(f"top_logprobs must be 0..{MAX_TOP_LOGPROBS}")

    def to_params(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "prompt": self.prompt.to_dict(),
                "sampling": self.sampling.to_dict(), "top_logprobs": self.top_logprobs}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Generate:
        return cls(SessionSpec.from_dict(params["spec"]),
                   Prompt.from_dict(params.get("prompt") or {}),
                   Sampling.from_dict(params.get("sampling") or {}),
                   params.get("top_logprobs", 0))


@dataclass(frozen=True)
class Compare(Generate):
    """The variant `spec` and its base, same prompt and sampling, side by side."""

    OP: ClassVar[str] = "compare"


@dataclass(frozen=True)
class CrossCheck(Request):
    """The same model or variant on two backends, on the same token ids."""

    OP: ClassVar[str] = "cross_check"
    first: SessionSpec
    second: SessionSpec
    prompts: tuple[Prompt, ...]
    tokens: int = 8
    genai: bool = False

    def __post_init__(self) -> None:
        if not 1 <= len(self.prompts) <= MAX_CROSS_CHECK_PROMPTS:
            raise RefusedError(f"cross_check needs 1 to {MAX_CROSS_CHECK_PROMPTS} prompts")
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or not (
                1 <= self.tokens <= MAX_CROSS_CHECK_TOKENS):
            raise RefusedError(f"cross_check decodes 1 to {MAX_CROSS_CHECK_TOKENS} tokens "
                               "per prompt")

    def to_params(self) -> dict[str, Any]:
        return {"first": self.first.to_dict(), "second": self.second.to_dict(),
                "prompts": [p.to_dict() for p in self.prompts], "tokens": self.tokens,
                "genai": self.genai}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> CrossCheck:
        return cls(SessionSpec.from_dict(params["first"]),
                   SessionSpec.from_dict(params["second"]),
                   tuple(Prompt.from_dict(p) for p in params.get("prompts") or []),
                   params.get("tokens", 8), bool(params.get("genai")))


@dataclass(frozen=True)
class BuildOpenVino(Request):
    """Build (or find in the cache) the structurally named OpenVINO IR of a GGUF base."""

    OP: ClassVar[str] = "build_openvino"
    source: str

    def to_params(self) -> dict[str, Any]:
        return {"source": self.source}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> BuildOpenVino:
        source = params["source"]
        if not isinstance(source, str):
            raise TypeError("source must be a path")
        return cls(source)


@dataclass(frozen=True)
class ScoreItem:
    """One item to score, teacher-forced (see `engine.runtime.scoring`).

    `kind` "text": `target` is a whole text, every token but its first scored. "pair":
    `prompt.text` (raw text, not scored) then `target`, the completion. "chat":
    `prompt.messages` rendered with the chat template as served (generation prompt
    included, no profile system prompt added) then `target`, the last assistant turn.
    `line` is where the item came from (1-based; 0 when it came from nowhere)."""

    kind: str
    target: str
    prompt: Prompt = field(default_factory=Prompt)
    line: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCORE_KINDS:
            raise RefusedError(f"score items are {', '.join(SCORE_KINDS)}, not {self.kind!r}")
        if not isinstance(self.target, str) or not self.target:
            raise RefusedError("a score item needs text to score")
        if isinstance(self.line, bool) or not isinstance(self.line, int) or self.line < 0:
            raise RefusedError("a score item's line is a number")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "prompt": self.prompt.to_dict(),
                "line": self.line}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ScoreItem:
        return ScoreItem(data["kind"], data["target"], Prompt.from_dict(data.get("prompt") or {}),
                         data.get("line", 0))


@dataclass(frozen=True)
class Score(Request):
    """Teacher-forced log-probabilities of `items` under the model or variant `spec`:
    per token, mean NLL per token and perplexity; with `exact_match`, also whether the
    greedy answer equals each pair's or chat's target. `per_token` includes every
    scored token's log-probability in the result (off for very large sets)."""

    OP: ClassVar[str] = "score"
    spec: SessionSpec
    items: tuple[ScoreItem, ...]
    exact_match: bool = False
    per_token: bool = True

    def __post_init__(self) -> None:
        if not 1 <= len(self.items) <= MAX_SCORE_ITEMS:
            raise RefusedError(f"score needs 1 to {MAX_SCORE_ITEMS} items")

    def to_params(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "items": [i.to_dict() for i in self.items],
                "exact_match": self.exact_match, "per_token": self.per_token}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Score:
        items = params.get("items")
        if not isinstance(items, list):
            raise RefusedError("items must be a list")
        return cls(SessionSpec.from_dict(params["spec"]),
                   tuple(ScoreItem.from_dict(i) for i in items[:MAX_SCORE_ITEMS + 1]),
                   bool(params.get("exact_match")), bool(params.get("per_token", True)))


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
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # e.g. a non-finite scale in the identity: refused, not an internal error
        raise RefusedError(f"malformed {op} request: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Token:
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


@dataclass(frozen=True)
class Progress:
    stage: str
    fraction: float


@dataclass(frozen=True)
class Finished:
    result: Any


@dataclass(frozen=True)
class Failed:
    error: StudioError


@dataclass(frozen=True)
class Cancelled:
    pass


Event = Token | Progress | Finished | Failed | Cancelled
TERMINAL = (Finished, Failed, Cancelled)


def decode_event(message: dict[str, Any]) -> Event | None:
    """The typed event of an engine message (None for one this client does not know)."""
    kind = message.get("event")
    if kind == "token":
        return Token(str(message.get("side", "main")), int(message.get("token_id", -1)),
                     str(message.get("text", "")), float(message.get("logprob", 0.0)),
                     int(message.get("index", 0)),
                     tuple((int(i), str(t), float(lp)) for i, t, lp in message.get("top") or ()),
                     str(message.get("piece", "")))
    if kind == "progress":
        return Progress(str(message.get("stage", "")), float(message.get("fraction", 0.0)))
    if kind == "finished":
        return Finished(message.get("result"))
    if kind == "failed":
        return Failed(protocol.error_from_payload(message.get("error") or {}))
    if kind == "cancelled":
        return Cancelled()
    return None
