"""The llama.cpp engine process on the real embedded model, with adapters the tests write.

One engine process serves the whole module (one resident copy of the weights), the
way the app uses it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.store import Catalog
from engine.runtime.client import EngineClient
from engine.errors import Cancelled, EngineError, RefusedError
from tests.engine_helpers import BASE, generate, params, populate
from engine.catalog import resolve


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, base_info) -> Any:
    import os

    tmp = tmp_path_factory.mktemp("engine")
    old = os.environ.get("VARIANT_STUDIO_HOME")
    os.environ["VARIANT_STUDIO_HOME"] = str(tmp / "home")
    catalog = Catalog()
    populate(catalog, tmp, base_info)
    client = EngineClient()
    yield catalog, client
    client.close()
    if old is None:
        del os.environ["VARIANT_STUDIO_HOME"]
    else:
        os.environ["VARIANT_STUDIO_HOME"] = old


def test_variants_change_output_and_never_leak_into_the_base(world) -> None:
    catalog, client = world
    base_first = generate(client, catalog, BASE)
    va = generate(client, catalog, "va")
    vb = generate(client, catalog, "vb")
    va0 = generate(client, catalog, "va0")
    base_after = generate(client, catalog, BASE)
    va_again = generate(client, catalog, "va")
    assert len(base_first["token_ids"]) == 24
    assert va["token_ids"] != base_first["token_ids"], "the adapter changed nothing"
    assert vb["token_ids"] != va["token_ids"], "two adapters gave the same output"
    assert va0["token_ids"] == base_first["token_ids"], "scale 0 must equal the base"
    assert base_after["token_ids"] == base_first["token_ids"], "variant state leaked"
    assert va_again["token_ids"] == va["token_ids"], "greedy output must be reproducible"
    identities = {r["identity"] for r in (base_first, va, vb, va0)}
    assert len(identities) == 4


def test_variant_first_then_base_in_a_fresh_engine(world) -> None:
    catalog, client = world
    reference = generate(client, catalog, BASE)
    fresh = EngineClient()
    try:
        generate(fresh, catalog, "vb")
        assert generate(fresh, catalog, BASE)["token_ids"] == reference["token_ids"]
    finally:
        fresh.close()


def test_compare_sides_equal_plain_generations(world) -> None:
    catalog, client = world
    events: list[dict] = []
    handle = client.submit("compare", params(catalog, "va"), events.append)
    result = handle.wait(300)
    base = generate(client, catalog, BASE)
    variant = generate(client, catalog, "va")
    assert result["base"]["token_ids"] == base["token_ids"]
    assert result["variant"]["token_ids"] == variant["token_ids"]
    assert result["base"]["identity"] == base["identity"]
    assert result["variant"]["identity"] == variant["identity"]
    div = result["first_divergence"]
    assert div is not None and base["token_ids"][:div] == variant["token_ids"][:div]
    assert base["token_ids"][div] != variant["token_ids"][div]
    assert result["adapter_effect"] > 0.05
    for side in ("base", "variant"):
        r = result[side]
        assert len(r["logprobs"]) == len(r["token_ids"])
        assert all(lp <= 0 for lp in r["logprobs"]) and r["tokens_per_second"] > 0
    sides = {e["side"] for e in events if e["event"] == "token"}
    assert sides == {"base", "variant"}


def test_adapter_effect_is_zero_for_scale_zero(world) -> None:
    catalog, client = world
    result = client.call("compare", params(catalog, "va0"), timeout=300)
    assert result["first_divergence"] is None
    assert result["adapter_effect"] == 0.0


def test_seeded_sampling_is_reproducible_and_stop_strings_end_text(world) -> None:
    catalog, client = world
    one = generate(client, catalog, "vb", temperature=0.9, seed=42, top_k=40, top_p=0.9)
    two = generate(client, catalog, "vb", temperature=0.9, seed=42, top_k=40, top_p=0.9)
    assert one["token_ids"] == two["token_ids"]
    full = generate(client, catalog, BASE)
    word = full["text"].split()[3]
    stopped = generate(client, catalog, BASE, stop=[word])
    assert stopped["finish_reason"] == "stop" and word not in stopped["text"]
    assert full["text"].startswith(stopped["text"])


def test_cancel_ends_with_cancelled_and_no_more_tokens(world) -> None:
    catalog, client = world
    after_cancel: list[dict] = []
    cancelled = threading.Event()
    holder: dict = {}

    def on_event(event: dict) -> None:
        if cancelled.is_set():
            after_cancel.append(event)
        elif event["event"] == "token" and event["index"] == 2:
            cancelled.set()
            client.cancel(holder["handle"])

    holder["handle"] = client.submit("generate", params(catalog, "va", max_tokens=2000),
                                     on_event)
    with pytest.raises(Cancelled):
        holder["handle"].wait(300)
    assert [e["event"] for e in after_cancel] == ["cancelled"]
    assert generate(client, catalog, "va")["finish_reason"] == "length"  # still serving


def test_killing_the_engine_fails_the_request_and_the_next_one_works(world) -> None:
    catalog, client = world
    first_pid = client.call("ping", timeout=60)["pid"]
    holder: dict = {}

    def on_event(event: dict) -> None:
        if event["event"] == "token" and event["index"] == 1:
            client.kill()

    holder["handle"] = client.submit("generate", params(catalog, BASE, max_tokens=2000),
                                     on_event)
    with pytest.raises(EngineError) as info:
        holder["handle"].wait(300)
    assert info.value.message.startswith("engine stopped: ")
    assert "SIGKILL" in info.value.message
    assert client.state == "crashed"
    assert generate(client, catalog, BASE)["finish_reason"] == "length"
    assert client.call("ping", timeout=60)["pid"] != first_pid


def test_adapter_changed_after_import_is_refused_at_session_open(world) -> None:
    catalog, client = world
    client.call("close_all", timeout=60)
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
    catalog, client = world
    client.call("close_all", timeout=60)
    for name in (BASE, "va", "vb", "vab"):  # four identities, at most three live
        generate(client, catalog, name, max_tokens=2)
    info = client.call("describe", timeout=60)
    names = [s["name"] for s in info["sessions"]]
    assert names == ["va", "vb", "vab"], "least recently used closes first"
    (resident,) = info["residents"]
    assert resident["sha256"] == catalog.model(BASE)["sha256"]
    vab = info["sessions"][-1]
    assert vab["identity"] == resolve.identity(catalog, "vab").key
    assert [(a["name"], a["scale"]) for a in vab["adapters"]] == [("a", 0.5), ("b", 0.5)]
    assert vab["adapters"][0]["sha256"] == catalog.adapter("a")["sha256"]
    assert info["memory"]["rss_bytes"] > resident["size_bytes"]


def test_kv_cache_grows_with_the_request_and_never_changes_results(world) -> None:
    """A session allocates the KV cells its requests need (powers of two up to n_ctx),
    and the allocation is invisible in the results: the same request gives bit-identical
    tokens and log-probabilities before and after the cache grew."""
    catalog, client = world
    client.call("close_all", timeout=60)

    def session(name: str) -> dict[str, Any]:
        info = client.call("describe", timeout=60)
        return next(s for s in info["sessions"] if s["name"] == name)

    small = generate(client, catalog, "va", max_tokens=24)
    assert session("va")["kv_capacity"] == 512 and session("va")["n_ctx"] == 4096
    long_prompt = {"text": "The lighthouse keeper counted the waves. " * 180}
    grown = generate(client, catalog, "va", prompt=long_prompt, max_tokens=4)
    assert 1024 < grown["prompt_tokens"] + 4 <= 2048
    assert session("va")["kv_capacity"] == 2048
    assert grown["identity"] == small["identity"]  # same session, same identity
    again = generate(client, catalog, "va", max_tokens=24)
    assert again["token_ids"] == small["token_ids"]
    assert again["logprobs"] == small["logprobs"]  # exact, not approximately


def test_eos_ends_a_generation_before_max_tokens(world) -> None:
    catalog, client = world
    prompt = {"text": "Reply with one word: yes or no. Is water wet?", "chat": True}
    result = generate(client, catalog, BASE, prompt=prompt, max_tokens=64)
    assert result["finish_reason"] == "eos"
    assert 0 < len(result["token_ids"]) < 64 and result["text"].strip()
    assert "<|im_end|>" not in result["text"]


def test_llama_cpp_rejection_is_a_refusal_that_says_why(tmp_path: Path, embedded_path: Path
                                                         ) -> None:
    """Python validation refuses these first; if a file ever reaches llama.cpp and it
    says no, the user still gets llama.cpp's reason (it only logs it)."""
    from engine.runtime.llama.backend import LlamaModel
    from engine.catalog.resolve import AdapterFile

    model = LlamaModel(str(embedded_path), "test")
    try:
        junk = tmp_path / "junk.gguf"
        junk.write_bytes(b"GGUF" + bytes(range(256)))
        cases = {junk: "failed to load lora adapter",
                 embedded_path: "expect general.type to be 'adapter'"}
        for path, reason in cases.items():
            with pytest.raises(RefusedError) as caught:
                model.acquire_adapter(AdapterFile("x", str(path), f"sha-{path}", 1.0))
            assert reason in caught.value.message and caught.value.details
            assert caught.value.exit_code == 3
        assert model.adapters == {}
    finally:
        model.close()
