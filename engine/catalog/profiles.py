"""A variant's runtime profile and the sampling settings of one request.

A profile is what a variant stores besides its base and adapters: a system prompt, a
context size, default sampling, and optionally the tool-call format its adapter was
trained to write (`tool_format`, one of `engine.formats.tool_calls.FORMATS`; absent:
the base's chat template decides). `Sampling` is the frozen value a request carries to
the engine. Both are checked against the one table of limits below, so a profile can
never hold a value a request would refuse.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from engine.errors import UsageError
from engine.formats.tool_calls import FORMATS

# setting -> (type, lowest, highest)
LIMITS: dict[str, tuple[type, float, float]] = {
    "n_ctx": (int, 256, 131072),
    "temperature": (float, 0.0, 5.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, 0, 100000),
    "repeat_penalty": (float, 0.5, 5.0),
    "max_tokens": (int, 1, 32768),
    "seed": (int, 0, 2**32 - 1),
}
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repeat_penalty", "seed", "max_tokens")
MAX_SYSTEM_PROMPT = 100_000

DEFAULT_PROFILE: dict[str, Any] = {
    "system_prompt": "",
    "n_ctx": 4096,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 40,
    "repeat_penalty": 1.1,
    "max_tokens": 256,
    "seed": 0,
}


def check_value(key: str, value: Any) -> int | float:
    """`value` as the type `key` takes, or UsageError naming the setting and its range."""
    kind, low, high = LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{key} must be a number, not {type(value).__name__}")
    if not math.isfinite(value) or not low <= value <= high:
        raise UsageError(f"{key} = {value!r} out of range ({low:g}..{high:g})")
    if kind is int and value != int(value):
        raise UsageError(f"{key} must be a whole number")
    return kind(value)


def check_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """Range-check a variant profile; unknown keys are refused."""
    out: dict[str, Any] = {}
    for key, value in profile.items():
        if key == "system_prompt":
            if not isinstance(value, str) or len(value) > MAX_SYSTEM_PROMPT:
                raise UsageError(f"system_prompt must be text (at most {MAX_SYSTEM_PROMPT} "
                                 "characters)")
            out[key] = value
        elif key == "tool_format":
            if value not in FORMATS:
                raise UsageError(f"tool_format must be one of {', '.join(FORMATS)}")
            out[key] = value
        elif key in LIMITS:
            out[key] = check_value(key, value)
        else:
            raise UsageError(f"unknown profile setting {key!r}")
    return out


@dataclass(frozen=True)
class Sampling:
    """How one request chooses its tokens (see `engine.runtime.sampler`)."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    repeat_penalty: float = 1.1
    seed: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in SAMPLING_KEYS:
            check_value(key, getattr(self, key))
        if not isinstance(self.stop, tuple) or len(self.stop) > 16 or any(
                not isinstance(s, str) or not s or len(s) > 256 for s in self.stop):
            raise UsageError("stop strings: at most 16, each 1-256 characters")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sampling:
        known = {k: v for k, v in data.items() if k in Sampling.__dataclass_fields__}
        if "stop" in known:
            if not isinstance(known["stop"], list | tuple):
                raise UsageError("stop must be a list of strings")
            known["stop"] = tuple(known["stop"])
        return Sampling(**known)

    @staticmethod
    def of_profile(profile: dict[str, Any], **overrides: Any) -> Sampling:
        """A profile's sampling, with `overrides` (None values are ignored) on top."""
        values = {k: profile[k] for k in SAMPLING_KEYS if k in profile}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Sampling.from_dict(values)


def trained_system_prompt(adapter: dict[str, Any]) -> str | None:
    """The system prompt adapter record `adapter` was trained with, as the provenance of
    its training run records it (every chat example shared it: `DataSet.system_prompt`);
    None when it was trained without one, or its record does not say."""
    provenance = adapter.get("provenance")
    data = provenance.get("data") if isinstance(provenance, dict) else None
    prompt = data.get("system_prompt") if isinstance(data, dict) else None
    if isinstance(prompt, str) and prompt.strip() and len(prompt) <= MAX_SYSTEM_PROMPT:
        return prompt
    return None
