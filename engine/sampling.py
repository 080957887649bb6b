"""Token sampling over raw logits, in numpy, identical for every backend.

Temperature 0 is greedy (argmax after the repeat penalty) and reproducible. With a
temperature, the order is llama.cpp's: repeat penalty, top-k, temperature, top-p,
then a draw from a generator seeded once per request, so the same seed gives the
same text.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from engine.errors import UsageError

PENALTY_WINDOW = 64


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    repeat_penalty: float = 1.1
    seed: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature, 0.0, 5.0),
            ("top_p", self.top_p, 0.0, 1.0),
            ("top_k", self.top_k, 0, 1_000_000),
            ("repeat_penalty", self.repeat_penalty, 0.5, 5.0),
            ("seed", self.seed, 0, 2**32 - 1),
            ("max_tokens", self.max_tokens, 1, 32768),
        )
        for name, value, low, high in checks:
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and low <= value <= high):
                raise UsageError(f"{name} = {value!r} out of range ({low:g}..{high:g})")
        if len(self.stop) > 16 or any(not s or len(s) > 256 for s in self.stop):
            raise UsageError("stop strings: at most 16, each 1-256 characters")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data

    @staticmethod
    def from_dict(data: dict) -> Sampling:
        known = {k: v for k, v in data.items() if k in Sampling.__dataclass_fields__}
        if "stop" in known:
            known["stop"] = tuple(known["stop"])
        return Sampling(**known)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - math.log(float(np.exp(shifted).sum()))


class Sampler:
    """Chooses tokens for one request; holds the seeded generator."""

    def __init__(self, sampling: Sampling) -> None:
        self.s = sampling
        self.rng = np.random.Generator(np.random.PCG64(sampling.seed))

    def choose(self, logits: np.ndarray, history: list[int]) -> int:
        logits = logits.astype(np.float32, copy=True)
        if self.s.repeat_penalty != 1.0 and history:
            recent = np.unique(np.asarray(history[-PENALTY_WINDOW:], dtype=np.int64))
            values = logits[recent]
            logits[recent] = np.where(values > 0, values / self.s.repeat_penalty,
                                      values * self.s.repeat_penalty)
        if self.s.temperature <= 0:
            return int(np.argmax(logits))
        candidates = np.arange(logits.shape[0])
        if 0 < self.s.top_k < logits.shape[0]:
            candidates = np.argpartition(-logits, self.s.top_k)[: self.s.top_k]
        # A stable order makes the draw independent of argpartition's internals.
        candidates = candidates[np.lexsort((candidates, -logits[candidates]))]
        scaled = logits[candidates].astype(np.float64) / self.s.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.s.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.s.top_p) + 1)
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(len(candidates), p=probs)])


class StopMatcher:
    """Finds stop strings in streamed text and holds back text that may start one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.text = ""
        self.emitted = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add text; returns (text safe to emit now, whether a stop string was hit)."""
        self.text += piece
        for stop in self.stops:
            at = self.text.find(stop, max(0, self.emitted - len(stop)))
            if at != -1:
                out = self.text[self.emitted:at]
                self.text = self.text[:at]
                self.emitted = at
                return out, True
        # Hold back a tail that could be the beginning of a stop string.
        partial = max((n for stop in self.stops for n in range(1, len(stop))
                       if self.text.endswith(stop[:n])), default=0)
        safe = max(self.emitted, len(self.text) - partial)
        out = self.text[self.emitted:safe]
        self.emitted = safe
        return out, False

    def flush(self) -> str:
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out
