"""The prefix cache: a warm request reuses the whole aligned chunks of its identity's
cached prompt and gives exactly the tokens and log-probabilities of a cold run; other
identities never share anything, however their prompts match."""

from __future__ import annotations

from typing import Any

import pytest

from engine.catalog.store import Catalog
from engine.formats.templates import Message
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests.engine_helpers import BASE, TIMEOUT, request
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # the real model through the engine process

# The first message is long enough (over 64 tokens) that the next turn finds whole
# aligned chunks of it in the cache.
TURNS = ["Here are my notes on the coast. " * 12 + "Tell me about the sea.",
         "And about rivers?", "Which is colder?", "Summarise all of that in one line."]


WORLD = Recipe(adapters=True)


def conversation(client: EngineClient, catalog: Catalog, name: str) -> list[dict[str, Any]]:
    """A chat of several turns, each turn's prompt holding every earlier answer."""
    history: list[Message] = []
    results = []
    for turn in TURNS:
        history.append(Message("user", turn))
        result = client.call(request(catalog, name, messages.Prompt(
            messages=tuple(history), chat=True), max_tokens=48), timeout=TIMEOUT)
        history.append(Message("assistant", result["text"]))
        results.append(result)
    return results


def cold(client: EngineClient, catalog: Catalog, name: str, result: dict[str, Any],
         history: list[Message]) -> dict[str, Any]:
    client.call(messages.CloseAll(), timeout=TIMEOUT)  # every session starts empty
    again = client.call(request(catalog, name, messages.Prompt(messages=tuple(history),
                                                               chat=True), max_tokens=48),
                        timeout=TIMEOUT)
    assert again["reused_tokens"] == 0
    return again


@pytest.mark.parametrize("name", [BASE, "va"])
def test_a_warm_turn_equals_a_cold_one_bit_for_bit(world: World,
                                                   name: str) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=TIMEOUT)
    warm = conversation(client, catalog, name)
    # Turns after the first reuse their identity's cached prompt, in whole chunks.
    assert warm[0]["reused_tokens"] == 0
    assert all(r["reused_tokens"] > 0 and r["reused_tokens"] % 64 == 0 for r in warm[1:])
    history = []
    for turn, result in zip(TURNS, warm, strict=True):
        history.append(Message("user", turn))
        if len(history) > 1:
            fresh = cold(client, catalog, name, result, history)
            assert fresh["token_ids"] == result["token_ids"]
            assert fresh["logprobs"] == result["logprobs"]  # exactly, not approximately
        history.append(Message("assistant", result["text"]))


def test_identities_never_share_warm_state(world: World) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=TIMEOUT)
    prompt = messages.Prompt("The same long prompt for everyone. " * 40, chat=True)
    first = client.call(request(catalog, "va", prompt), timeout=TIMEOUT)
    again = client.call(request(catalog, "va", prompt), timeout=TIMEOUT)
    assert first["reused_tokens"] == 0 and again["reused_tokens"] > 0
    # The same prompt under another identity (another adapter, the base, the same
    # adapter at another scale) starts from nothing.
    for other in ("vb", BASE, "va0", "vab"):
        result = client.call(request(catalog, other, prompt), timeout=TIMEOUT)
        assert result["reused_tokens"] == 0, other
    sessions = client.call(messages.Describe(), timeout=TIMEOUT)["sessions"]
    assert len({s["identity"] for s in sessions}) == len(sessions)


def test_the_adapter_effect_is_the_same_warm_and_cold(world: World
                                                      ) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=TIMEOUT)
    compare = request(catalog, "va", kind=messages.Compare)
    first = client.call(compare, timeout=TIMEOUT)
    second = client.call(compare, timeout=TIMEOUT)
    assert second["variant"]["reused_tokens"] == 0 or second["base"]["token_ids"]
    assert first["adapter_effect"] == second["adapter_effect"]
    assert first["base"]["logprobs"] == second["base"]["logprobs"]
