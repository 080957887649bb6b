"""Sampling and stop strings, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import UsageError
from engine.runtime.sampler import Sampler, Sampling, StopMatcher, log_softmax


def test_greedy_is_argmax_and_seeded_draws_repeat() -> None:
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    assert Sampler(Sampling(temperature=0, repeat_penalty=1.0)).choose(logits, []) == int(
        np.argmax(logits))
    draws = [[Sampler(Sampling(seed=7)).choose(logits, [])] for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    other = {Sampler(Sampling(seed=s, temperature=2.0, top_k=0, top_p=1.0)).choose(logits, [])
             for s in range(20)}
    assert len(other) > 1


def test_repeat_penalty_moves_greedy_off_a_repeated_token() -> None:
    logits = np.array([1.0, 0.9, 0.1], dtype=np.float32)
    sampler = Sampler(Sampling(temperature=0, repeat_penalty=1.5))
    assert sampler.choose(logits, [0]) == 1


def test_top_k_one_is_greedy() -> None:
    logits = np.random.default_rng(1).normal(size=500).astype(np.float32)
    assert Sampler(Sampling(top_k=1, temperature=1.0, repeat_penalty=1.0)).choose(
        logits, []) == int(np.argmax(logits))


@pytest.mark.parametrize("bad", [{"temperature": float("nan")}, {"top_p": 2.0},
                                 {"max_tokens": 0}, {"seed": -1}, {"stop": ("",)}])
def test_bad_settings_are_usage_errors(bad: dict) -> None:
    with pytest.raises(UsageError):
        Sampling(**bad)


def test_log_softmax_normalises() -> None:
    lp = log_softmax(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert np.isclose(np.exp(lp).sum(), 1.0)


def test_stop_strings_across_pieces() -> None:
    m = StopMatcher(("<|im_end|>", "\nUser:"))
    out = []
    for piece in ["Hello", " world<|im", "_end|> ignored"]:
        text, hit = m.feed(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "Hello world" and hit
    m = StopMatcher(("STOP",))
    assert m.feed("abcST") == ("abc", False)
    assert m.feed("xy") == ("STxy", False)
    assert m.flush() == ""
