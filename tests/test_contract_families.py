"""Contract tier: the real engine process on the tiny generated model of every family.

What the engine promises, checked on a real llama.cpp process for each family of
tests/families.py (one type per family, `matrix_helpers.rotation()`: F16, Q8_0 and
Q4_K_M all run): the base loads and generates; a variant over the family's GGUF LoRA
answers differently from its base and the engine reports the adapter applied (in the
result, on the session and on the resident model); a warm turn (the prefix cache) equals
the cold one token for token and bit for bit in its log-probabilities. The rest of the
tier: crash isolation in tests/test_crash_isolation.py, a three-step training in
tests/test_contract_training.py.

One engine process and one catalog for the module, the family fixtures shared by the
session (built once per source version, tests/families.py). The acceptance matrix
(tests/test_matrix_*.py, slow) runs every feature on every type; this is the cheap cut
of it that every quick run pays for (budget: tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests import families
from tests.engine_helpers import sampling
from tests.matrix_helpers import add_gguf_variant, ids, rotation

pytestmark = pytest.mark.contract

CASES = rotation()  # one type per family, every type on some family
TOKENS = 8
TIMEOUT = 120  # a hang bound only
# The first turn is long enough (over two 64-token chunks with the chat template) that
# the second finds whole aligned chunks of it in the cache.
TURNS = ("Here are my notes on the coast and its old lighthouse. " * 6
         + "Tell me about the sea.", "And about rivers?")


@pytest.fixture(scope="module")
def world(module_home: Path, family_files: dict[str, families.FamilyFiles]
          ) -> Iterator[dict[str, Any]]:
    """Every case's base, adapter and variant in one catalog; one engine process."""
    catalog = Catalog()
    names = {variant: add_gguf_variant(catalog, family_files[variant], kind)
             for variant, kind in CASES}
    client = EngineClient()
    try:
        yield {"catalog": catalog, "client": client, "names": names}
    finally:
        client.close()


def generate(world: dict[str, Any], name: str, prompt: messages.Prompt) -> dict[str, Any]:
    request = messages.Generate(resolve.resolve(world["catalog"], name), prompt,
                                sampling(max_tokens=TOKENS))
    return world["client"].call(request, timeout=TIMEOUT)


def chat(*turns: str) -> messages.Prompt:
    """A chat prompt of user turns, each answered "Noted." (so a later turn's prompt
    starts with every earlier one)."""
    history: list[messages.Message] = []
    for turn in turns:
        if history:
            history.append(messages.Message("assistant", "Noted."))
        history.append(messages.Message("user", turn))
    return messages.Prompt(messages=tuple(history), chat=True)


@pytest.mark.parametrize(("variant", "kind"), CASES, ids=ids(CASES))
def test_the_base_loads_and_the_adapter_is_applied(variant: str, kind: str,
                                                   world: dict[str, Any]) -> None:
    catalog: Catalog = world["catalog"]
    base, adapter, var = world["names"][variant]
    prompt = chat(TURNS[1])
    plain, adapted = generate(world, base, prompt), generate(world, var, prompt)
    for name, answer in ((base, plain), (var, adapted)):
        assert answer["backend"] == "llama" and answer["name"] == name
        assert len(answer["token_ids"]) == TOKENS == len(answer["logprobs"]), answer
    # The adapter changes the answer (its tokens, or at least their log-probabilities).
    assert (adapted["token_ids"], adapted["logprobs"]) != (plain["token_ids"],
                                                           plain["logprobs"])
    # ... and the engine says it applied it: in the result, on the session, and loaded
    # on the resident base (by digest).
    sha = catalog.adapter(adapter)["sha256"]
    assert plain["adapters"] == []
    assert adapted["adapters"] == [{"name": adapter, "sha256": sha, "scale": 1.0}]
    assert adapted["identity"] != plain["identity"]
    status = world["client"].call(messages.Describe(), timeout=TIMEOUT)
    (resident,) = [r for r in status["residents"]
                   if r["sha256"] == catalog.model(base)["sha256"]]
    assert sha in resident["adapters_loaded"]
    sessions = {s["identity"]: s for s in status["sessions"]}
    assert sessions[adapted["identity"]]["adapters"] == adapted["adapters"]
    assert sessions[plain["identity"]]["adapters"] == []


@pytest.mark.parametrize(("variant", "kind"), CASES, ids=ids(CASES))
def test_a_warm_turn_equals_a_cold_one(variant: str, kind: str,
                                       world: dict[str, Any]) -> None:
    """The variant's second turn after its first (warm: the first turn's prompt is in
    its session's cache) equals the same turn in a fresh session, bit for bit."""
    client: EngineClient = world["client"]
    _, _, var = world["names"][variant]
    client.call(messages.CloseAll(), timeout=TIMEOUT)
    first = generate(world, var, chat(TURNS[0]))
    warm = generate(world, var, chat(*TURNS))
    client.call(messages.CloseAll(), timeout=TIMEOUT)
    cold = generate(world, var, chat(*TURNS))
    assert first["reused_tokens"] == 0 and cold["reused_tokens"] == 0
    # Whole aligned chunks of the first turn's prompt are reused.
    assert warm["reused_tokens"] > 0 and warm["reused_tokens"] % 64 == 0, warm
    assert warm["token_ids"] == cold["token_ids"]
    assert warm["logprobs"] == cold["logprobs"]  # exactly, not approximately

