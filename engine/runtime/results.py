"""What the engine answers: one typed result per request, as its requests are typed.

The engine thread builds these values; the host writes them as JSON (`to_dict`), and
the client reads them back (`from_dict`, every field checked by `engine.wire`), so a
front end gets a `GenerationResult`, `CompareResult`, `ScoreResult`, `CrossCheckResult`
or `EngineStatus` and reads fields, never keys. The JSON shape is the one the CLI's
`--json` output, the server's replay field and stored comparisons have always had.

`result["field"]` still reads a field's JSON value (`Result.__getitem__`), for code
outside the front ends that was written against the old dictionaries (the training
room's tools); new code reads attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine import wire
from engine.catalog.resolve import SessionSpec
from engine.formats.templates import ToolCall


class Result(wire.Wire):
    """Base of the results: JSON through `engine.wire`, and read-only key access to
    that JSON (see the module doc)."""

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def keys(self) -> list[str]:
        return list(self.to_dict())


@dataclass(frozen=True)
class AdapterUse(Result):
    """An adapter as a result names it: what ran, at which scale."""

    name: str
    sha256: str
    scale: float


def adapters_of(spec: SessionSpec) -> tuple[AdapterUse, ...]:
    return tuple(AdapterUse(a.name, a.sha256, a.scale) for a in spec.adapters)


# One alternative token: (token id, its text, its log-probability).
Alternative = tuple[int, str, float]


@dataclass(frozen=True)
class MachineLoad(Result):
    """Other programs were using the CPU cores the engine decodes on
    (`engine.runtime.contention`): what they used and how many threads the engine
    decoded on because of it, out of how many it would use on a quiet machine."""

    other_cores: float
    threads: int
    max_threads: int
    cpus: int


@dataclass(frozen=True)
class GenerationResult(Result):
    """One generated answer: its text and tokens, what produced it and how fast.

    `name` is the name asked for (two variants with the same parts share a session);
    `replay` is the record that regenerates it (`engine.runtime.replay`: a JSON object
    kept as it is, which `ReplayRecord.from_dict` reads)."""

    name: str
    kind: str
    backend: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    identity: str
    identity_short: str
    adapters: tuple[AdapterUse, ...]
    prompt_tokens: int
    reused_tokens: int
    prompt_seconds: float
    finish_reason: str | None
    tokens_per_second: float
    # Per token, the most likely alternatives (only when the request asked for them).
    top_logprobs: tuple[tuple[Alternative, ...], ...] | None = field(
        default=None, metadata=wire.OMIT_NONE)
    replay: dict[str, Any] | None = field(default=None, metadata=wire.OMIT_NONE)
    # With tools: the answer's content without its tool calls, and the calls.
    content: str | None = field(default=None, metadata=wire.OMIT_NONE)
    tool_calls: tuple[ToolCall, ...] | None = field(default=None, metadata=wire.OMIT_NONE)
    # Set when other programs' CPU use was slowing the engine as the answer finished.
    machine_load: MachineLoad | None = field(default=None, metadata=wire.OMIT_NONE)


@dataclass(frozen=True)
class CompareResult(Result):
    """A variant and its base on the same prompt and sampling."""

    base: GenerationResult
    variant: GenerationResult
    first_divergence: int | None
    # Mean |log p_base - log p_variant| over the base's tokens (None: no base tokens).
    adapter_effect: float | None

    def side(self, name: str) -> GenerationResult:
        """The "base" or "variant" side."""
        return self.base if name == "base" else self.variant


@dataclass(frozen=True)
class ScoreRow(Result):
    """One scored item (`engine.runtime.scoring`)."""

    line: int
    kind: str
    tokens: int
    nll: float
    mean_nll: float | None
    exact: bool | None
    answer: str | None
    # Every scored token's log-probability (only when the request asked for them).
    logprobs: tuple[float, ...] | None = field(default=None, metadata=wire.OMIT_NONE)
    # An item whose answer is a tool call: do the greedy answer's calls equal it (by
    # function name and JSON-equal arguments)? None for other items.
    tool_call_exact: bool | None = field(default=None, metadata=wire.OMIT_NONE)


@dataclass(frozen=True)
class ScoreResult(Result):
    """Teacher-forced figures of a set of items under one model or variant."""

    name: str
    kind: str
    backend: str
    identity: str
    identity_short: str
    openvino_profile: str | None
    adapters: tuple[AdapterUse, ...]
    items: int
    tokens: int
    nll: float
    mean_nll: float | None
    perplexity: float | None
    exact_items: int
    exact_matches: int
    exact_match: float | None
    seconds: float
    rows: tuple[ScoreRow, ...]
    # The adapters whose evaluation set kept this score (set by who records it).
    recorded_on: tuple[str, ...] | None = field(default=None, metadata=wire.OMIT_NONE)
    # Tool-call exact match over the items whose answer is a tool call (None: none was
    # judged). Defaults, so a result kept before it existed still reads.
    tool_call_items: int = 0
    tool_call_matches: int = 0
    tool_call_exact: float | None = field(default=None, metadata=wire.OMIT_NONE)

    @property
    def exact_text(self) -> str:
        """The exact-match figure in words: "95.0% (57/60)", or "n/a"."""
        if self.exact_match is None:
            return "n/a"
        return f"{self.exact_match:.1%} ({self.exact_matches}/{self.exact_items})"

    @property
    def tool_call_text(self) -> str:
        """The tool-call exact-match figure in words: "80.0% (4/5)", or "n/a"."""
        if self.tool_call_exact is None:
            return "n/a"
        return (f"{self.tool_call_exact:.1%} "
                f"({self.tool_call_matches}/{self.tool_call_items})")


@dataclass(frozen=True)
class CheckedSide(Result):
    """One side of a cross-check: what ran."""

    name: str
    backend: str
    identity: str
    base: str


@dataclass(frozen=True)
class CrossCheckRow(Result):
    """One prompt of a cross-check: both sides' greedy tokens and the distance of their
    next-token distributions along the first side's tokens."""

    prompt_tokens: int
    same_token_ids: bool
    first: tuple[int, ...]
    second: tuple[int, ...]
    agreeing_tokens: int
    kl: tuple[float, ...]
    max_kl: float
    mean_kl: float
    top1_agreement: float


@dataclass(frozen=True)
class GenAICheck(Result):
    """OpenVINO GenAI's own greedy tokens on the same prompts (`parity --genai`)."""

    mode: str
    tokens: tuple[tuple[int, ...], ...]
    agreeing_tokens: tuple[int, ...]
    stderr: tuple[str, ...]
    warnings: tuple[str, ...]
    unused_tensors: tuple[str, ...]


@dataclass(frozen=True)
class CrossCheckResult(Result):
    """The same model or variant on two backends (`engine.runtime.cross_check`)."""

    first: CheckedSide
    second: CheckedSide
    tokens: int
    prompts: tuple[CrossCheckRow, ...]
    max_kl: float
    mean_kl: float
    top1_agreement: float
    first_token_agreement: float
    min_agreeing_tokens: int
    openvino_warnings: tuple[str, ...] = ()
    unused_lora_tensors: tuple[str, ...] = ()
    genai: GenAICheck | None = field(default=None, metadata=wire.OMIT_NONE)


@dataclass(frozen=True)
class Memory(Result):
    rss_bytes: int
    peak_rss_bytes: int


@dataclass(frozen=True)
class ResidentStatus(Result):
    """A loaded base model. `details` are its backend's own figures (`ResidentModel.
    details`); in JSON they sit beside the common fields."""

    base: str
    model_name: str
    path: str
    sha256: str
    backend: str
    size_bytes: int
    details: dict[str, Any] = field(default_factory=dict)

    COMMON = ("base", "model_name", "path", "sha256", "backend", "size_bytes")

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.COMMON}
        return {**wire.encode(self.details), **out}

    @classmethod
    def from_dict(cls, data: Any) -> ResidentStatus:
        if not isinstance(data, dict):
            raise wire.WireError(f"a resident is an object, not {type(data).__name__}")
        return wire.decode(cls, {**{k: v for k, v in data.items() if k in cls.COMMON},
                                 "details": {k: v for k, v in data.items()
                                             if k not in cls.COMMON}})


@dataclass(frozen=True)
class SessionStatus(Result):
    """A live session (a context over a resident, of one identity)."""

    name: str
    kind: str
    identity: str
    number: int
    busy: bool
    backend: str
    base: str
    adapters: tuple[AdapterUse, ...]
    n_ctx: int
    cached_tokens: int
    kv_capacity: int
    kv_bytes: int
    generations: int


@dataclass(frozen=True)
class EngineStatus(Result):
    """What the engine holds now (`describe`, and what warming a session answers)."""

    pid: int
    residents: tuple[ResidentStatus, ...]
    sessions: tuple[SessionStatus, ...]
    memory: Memory
    max_sessions: int
    n_threads: int
