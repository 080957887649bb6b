"""What every backend's engine does the same way, on the real models: llama.cpp on the
embedded GGUF with GGUF adapters, OpenVINO on the OpenVINO default with PEFT adapters.

Each backend gets one catalog and one engine process for the module (variants va, vb,
va0 = a at scale 0, vab over adapters a and b, as `engine_helpers.populate` makes
them). What only one backend has (llama.cpp's KV growth and session limits, OpenVINO's
compiled-model rebuilds and GenAI cross-check) lives in test_engine_llama.py and
test_openvino_engine.py.
"""

from __future__ import annotations

import threading

import pytest

from engine.catalog import resolve
from engine.errors import Cancelled
from engine.runtime import messages
from tests.engine_helpers import request, tokens_of
from tests.world import Recipe, World

TIMEOUT = 900  # a hang bound only (the first OpenVINO request compiles the model)


WORLDS = [pytest.param(Recipe(adapters=True), id="llama"),
          # OpenVINO: a build first (shared by the run)
          pytest.param(Recipe(openvino=True, adapters=True), id="openvino",
                       marks=pytest.mark.slow)]


def generate(world: World, name: str, **kw) -> dict:
    return world.engine.call(request(world.catalog, name, **kw), timeout=TIMEOUT)


def test_variants_change_output_and_never_leak_into_the_base(world: World) -> None:
    base_first = generate(world, world.base)
    va = generate(world, "va")
    vb = generate(world, "vb")
    va0 = generate(world, "va0")
    base_after = generate(world, world.base)
    va_again = generate(world, "va")
    assert len(base_first["token_ids"]) == 24
    assert va["token_ids"] != base_first["token_ids"], "the adapter changed nothing"
    assert vb["token_ids"] != va["token_ids"], "two adapters gave the same output"
    assert va0["token_ids"] == base_first["token_ids"], "scale 0 must equal the base"
    assert va0["logprobs"] == base_first["logprobs"]
    assert base_after["token_ids"] == base_first["token_ids"], "variant state leaked"
    assert base_after["logprobs"] == base_first["logprobs"]
    assert va_again["token_ids"] == va["token_ids"], "greedy output must be reproducible"
    for result in (base_first, va, vb, va0):
        assert result["backend"] == world.backend
    assert len({r["identity"] for r in (base_first, va, vb, va0)}) == 4
    runtime = {"llama": "llama-cpp-python/0.3", "openvino": "openvino-genai/2026.4"}
    assert resolve.identity(world.catalog, "va").runtime.startswith(runtime[world.backend])


def test_compare_sides_equal_plain_generations(world: World) -> None:
    events: list[messages.Event] = []
    handle = world.engine.submit(request(world.catalog, "va", kind=messages.Compare),
                                 events.append)
    result = handle.wait(TIMEOUT)
    base = generate(world, world.base)
    variant = generate(world, "va")
    assert result["base"]["token_ids"] == base["token_ids"]
    assert result["variant"]["token_ids"] == variant["token_ids"]
    assert result["base"]["identity"] == base["identity"]
    assert result["variant"]["identity"] == variant["identity"]
    assert result["variant"]["identity"] == resolve.identity(world.catalog, "va").key
    assert result["base"]["backend"] == result["variant"]["backend"] == world.backend
    div = result["first_divergence"]
    assert div is not None and base["token_ids"][:div] == variant["token_ids"][:div]
    assert base["token_ids"][div] != variant["token_ids"][div]
    assert result["adapter_effect"] > 0.05
    for side in ("base", "variant"):
        r = result[side]
        assert len(r["logprobs"]) == len(r["token_ids"])
        assert all(lp <= 0 for lp in r["logprobs"]) and r["tokens_per_second"] > 0
    assert {e.side for e in tokens_of(events)} == {"base", "variant"}


def test_adapter_effect_is_zero_for_scale_zero(world: World) -> None:
    result = world.engine.call(request(world.catalog, "va0", kind=messages.Compare),
                               timeout=TIMEOUT)
    assert result["first_divergence"] is None
    assert result["adapter_effect"] == 0.0


def test_seeded_sampling_is_reproducible_and_stop_strings_end_text(world: World) -> None:
    seeded = {"temperature": 0.9, "top_k": 40, "top_p": 0.9}
    one = generate(world, "vb", seed=42, **seeded)
    two = generate(world, "vb", seed=42, **seeded)
    other = generate(world, "vb", seed=43, **seeded)
    assert one["token_ids"] == two["token_ids"] and one["token_ids"] != other["token_ids"]
    full = generate(world, world.base)
    word = full["text"].split()[3]
    stopped = generate(world, world.base, stop=[word])
    assert stopped["finish_reason"] == "stop" and word not in stopped["text"]
    assert full["text"].startswith(stopped["text"])


def test_cancel_ends_with_cancelled_and_no_more_tokens(world: World) -> None:
    client = world.engine
    after_cancel: list[messages.Event] = []
    cancelled = threading.Event()
    holder: dict = {}

    def on_event(event: messages.Event) -> None:
        if cancelled.is_set():
            after_cancel.append(event)
        elif isinstance(event, messages.Token) and event.index == 2:
            cancelled.set()
            client.cancel(holder["handle"])

    holder["handle"] = client.submit(request(world.catalog, "va", max_tokens=2000), on_event)
    with pytest.raises(Cancelled):
        holder["handle"].wait(TIMEOUT)
    assert after_cancel == [messages.Cancelled()]
    assert generate(world, "va", max_tokens=3)["finish_reason"] == "length"  # still serving

