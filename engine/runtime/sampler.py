"""Token sampling over raw logits, in numpy, identical for every backend.

The settings are an `engine.catalog.profiles.Sampling` value.

Temperature 0 is greedy (argmax after the repeat penalty) and reproducible. With a
temperature, the order is llama.cpp's: repeat penalty, top-k, temperature, top-p,
then a draw from a generator seeded once per request, so the same seed gives the
same text.

A constrained request (a JSON schema, a tool call: `engine.runtime.constraint`) gives
the sampler a `Mask`: before every choice, the tokens the grammar does not allow are
set to -inf (after the repeat penalty, before top-k), and the chosen token is fed
back to it. Every backend samples here, so every backend is constrained the same way.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from engine.catalog.profiles import Sampling

PENALTY_WINDOW = 64


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - math.log(float(np.exp(shifted).sum()))


def token_logprob(logits: np.ndarray, token: int) -> float:
    """log softmax(logits)[token], for the token loop: exponentials in float32 (about a
    third of `log_softmax`'s time on a 49k vocabulary), summed in float64; it agrees
    with `log_softmax` to about 1e-6."""
    row = np.asarray(logits, dtype=np.float32)
    top = row.max()
    total = np.exp(row - top).sum(dtype=np.float64)
    return float(row[token] - top) - math.log(float(total))


class Mask(Protocol):
    """A grammar's state for one request (`engine.runtime.constraint.Matcher`)."""

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens not allowed next to -inf, in place."""

    def accept(self, token: int) -> None:
        """The token chosen."""

    @property
    def done(self) -> bool:
        """Nothing but the end may follow."""
        ...


class Sampler:
    """Chooses tokens for one request; holds the seeded generator, and the grammar's
    state when the request is constrained."""

    def __init__(self, sampling: Sampling, constraint: Mask | None = None) -> None:
        self.s = sampling
        self.rng = np.random.Generator(np.random.PCG64(sampling.seed))
        self.constraint = constraint

    @property
    def finished(self) -> bool:
        """A constrained answer is complete (its grammar allows only the end)."""
        return self.constraint is not None and self.constraint.done

    def choose(self, logits: np.ndarray, history: list[int]) -> int:
        logits = logits.astype(np.float32, copy=True)
        if self.s.repeat_penalty != 1.0 and history:
            recent = np.unique(np.asarray(history[-PENALTY_WINDOW:], dtype=np.int64))
            values = logits[recent]
            logits[recent] = np.where(values > 0, values / self.s.repeat_penalty,
                                      values * self.s.repeat_penalty)
        if self.constraint is None:
            return self._pick(logits)
        self.constraint.mask(logits)
        token = self._pick(logits)
        self.constraint.accept(token)
        return token

    def _pick(self, logits: np.ndarray) -> int:
        if self.s.temperature <= 0:
            return int(np.argmax(logits))
        candidates = np.arange(logits.shape[0])
        if 0 < self.s.top_k < logits.shape[0]:
            candidates = np.argpartition(-logits, self.s.top_k)[: self.s.top_k]
        # A stable order makes the draw independent of argpartition's internals.
        candidates = candidates[np.lexsort((candidates, -logits[candidates]))]
        scaled = logits[candidates].astype(np.float64) / self.s.temperature
        probs = np.exp(scaled - scaled.max())  # masked tokens (-inf) get 0
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
