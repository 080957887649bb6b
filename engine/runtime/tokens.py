"""Small facts about token sequences, shared by the sessions and the backends.

Its own module so that a backend (`engine.runtime.llama.backend`) needs nothing from
the backend interface that loads it (`engine.runtime.backend`): no import circle.
"""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def first_divergence(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]
                     ) -> int | None:
    """The first position where `a` and `b` differ (where the shorter one ends, if one
    is a prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
