"""The llama.cpp engine process on the real embedded model, with adapters the tests write.

One engine process serves the whole module (one resident copy of the weights), the
way the app uses it. What every backend does alike (variants, compare, sampling,
cancel) is in test_engine_backends.py; here is what is llama.cpp's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.catalog import resolve
from engine.catalog.store import AdapterSpec
from engine.errors import EngineError, RefusedError
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests.engine_helpers import BASE, generate, request
from tests.world import Recipe

WORLD = Recipe(adapters=True)


@pytest.mark.slow
def test_variant_first_then_base_in_a_fresh_engine(world) -> None:
    catalog, client = world.catalog, world.engine
    reference = generate(client, catalog, BASE)
    fresh = EngineClient()
    try:
        generate(fresh, catalog, "vb")
        assert generate(fresh, catalog, BASE)["token_ids"] == reference["token_ids"]
    finally:
        fresh.close()


def test_two_names_for_the_same_parts_share_a_session_and_keep_their_names(world) -> None:
    """The variant's own name is not in the identity: a variant with the same parts as
    another is served by the same session, and each result still names its variant."""
    catalog, client = world.catalog, world.engine
    catalog.add_variant("va-same", BASE, [AdapterSpec("a", 1.0)])
    assert resolve.identity(catalog, "va-same") == resolve.identity(catalog, "va")
    client.call(messages.CloseAll(), timeout=60)
    va = generate(client, catalog, "va", max_tokens=4)
    same = generate(client, catalog, "va-same", max_tokens=4)
    assert same["identity"] == va["identity"] and same["token_ids"] == va["token_ids"]
    sessions = client.call(messages.Describe(), timeout=60)["sessions"]
    assert [s["identity"] for s in sessions] == [va["identity"]]  # one session served both
    assert (va["name"], same["name"]) == ("va", "va-same")


def test_killing_the_engine_fails_the_request_and_the_next_one_works(world) -> None:
    catalog, client = world.catalog, world.engine
    first_pid = client.call(messages.Ping(), timeout=60)["pid"]
    holder: dict = {}

    def on_event(event: messages.Event) -> None:
        if isinstance(event, messages.Token) and event.index == 1:
            client.kill()

    holder["handle"] = client.submit(request(catalog, BASE, max_tokens=2000), on_event)
    with pytest.raises(EngineError) as info:
        holder["handle"].wait(300)
    assert info.value.message.startswith("engine stopped: ")
    assert "SIGKILL" in info.value.message
    assert client.state == "crashed"
    assert generate(client, catalog, BASE)["finish_reason"] == "length"
    assert client.call(messages.Ping(), timeout=60)["pid"] != first_pid


def test_adapter_changed_after_import_is_refused_at_session_open(world) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=60)
    stored = Path(catalog.adapter("b")["path"])
    original = stored.read_bytes()
    try:
        with stored.open("r+b") as handle:
            handle.seek(-4, 2)
            handle.write(b"\x00\x00\x80\x7f")
        with pytest.raises(RefusedError) as info:
            generate(client, catalog, "vb")
        assert "changed on disk after import" in info.value.message
        assert generate(client, catalog, BASE)["token_ids"]  # the engine is fine
    finally:
        stored.write_bytes(original)


def test_describe_reports_sessions_adapters_and_memory(world) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=60)
    for name in (BASE, "va", "vb", "vab"):  # four identities, at most three live
        generate(client, catalog, name, max_tokens=2)
    info = client.call(messages.Describe(), timeout=60)
    names = [s["name"] for s in info["sessions"]]
    assert names == ["va", "vb", "vab"], "least recently used closes first"
    (resident,) = info["residents"]
    assert resident["sha256"] == catalog.model(BASE)["sha256"]
    vab = info["sessions"][-1]
    assert vab["identity"] == resolve.identity(catalog, "vab").key
    assert [(a["name"], a["scale"]) for a in vab["adapters"]] == [("a", 0.5), ("b", 0.5)]
    assert vab["adapters"][0]["sha256"] == catalog.adapter("a")["sha256"]
    assert info["memory"]["rss_bytes"] > resident["size_bytes"]


@pytest.mark.slow
def test_kv_cache_grows_with_the_request_and_never_changes_results(world) -> None:
    """A session allocates the KV cells its requests need (powers of two up to n_ctx),
    and the allocation is invisible in the results: the same request gives bit-identical
    tokens and log-probabilities before and after the cache grew."""
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=60)

    def session(name: str) -> dict[str, Any]:
        info = client.call(messages.Describe(), timeout=60)
        return next(s for s in info["sessions"] if s["name"] == name)

    small = generate(client, catalog, "va", max_tokens=24)
    assert session("va")["kv_capacity"] == 512 and session("va")["n_ctx"] == 4096
    long_prompt = messages.Prompt("The lighthouse keeper counted the waves. " * 180)
    grown = generate(client, catalog, "va", prompt=long_prompt, max_tokens=4)
    assert 1024 < grown["prompt_tokens"] + 4 <= 2048
    assert session("va")["kv_capacity"] == 2048
    assert grown["identity"] == small["identity"]  # same session, same identity
    again = generate(client, catalog, "va", max_tokens=24)
    assert again["token_ids"] == small["token_ids"]
    assert again["logprobs"] == small["logprobs"]  # exact, not approximately


def test_eos_ends_a_generation_before_max_tokens(world) -> None:
    catalog, client = world.catalog, world.engine
    prompt = messages.Prompt("Reply with one word: yes or no. Is water wet?", chat=True)
    result = generate(client, catalog, BASE, prompt=prompt, max_tokens=64)
    assert result["finish_reason"] == "eos"
    assert 0 < len(result["token_ids"]) < 64 and result["text"].strip()
    assert "<|im_end|>" not in result["text"]


def test_llama_cpp_rejection_is_a_refusal_that_says_why(tmp_path: Path, embedded_path: Path
                                                         ) -> None:
    """Python validation refuses these first; if a file ever reaches llama.cpp and it
    says no, the user still gets llama.cpp's reason (it only logs it)."""
    from engine.catalog.resolve import AdapterFile
    from engine.runtime.llama.backend import LlamaModel

    model = LlamaModel(str(embedded_path), "test")
    try:
        junk = tmp_path / "junk.gguf"
        junk.write_bytes(b"GGUF" + bytes(range(256)))
        cases = {junk: "failed to load lora adapter",
                 embedded_path: "expect general.type to be 'adapter'"}
        for path, reason in cases.items():
            with pytest.raises(RefusedError) as caught:
                model.load_adapter(AdapterFile("x", str(path), f"sha-{path}", 1.0))
            assert reason in caught.value.message and caught.value.details
            assert caught.value.exit_code == 3
        assert model.adapters == {}
    finally:
        model.close()
