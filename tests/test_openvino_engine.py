"""The OpenVINO engine on the real default model, with PEFT adapters the tests write.

One engine process serves the module, as in the app: the base and its variants share
one compiled model (dynamic LoRA), each session its own KV state and adapter tensors.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.curated import openvino_default
from engine.catalog.store import AdapterSpec, Catalog
from engine.runtime.client import EngineClient
from engine.errors import Cancelled, RefusedError
from engine.catalog.resolve import resolve
from tests import factories as f
from tests.test_openvino_helpers import Home, register_default
from engine.catalog import resolve
from engine.catalog import imports

OV = openvino_default.NAME
PROMPT = {"text": "Write a short poem about the sea.", "chat": True}
GREEDY = {"temperature": 0.0, "max_tokens": 20, "repeat_penalty": 1.0}


def params(catalog: Catalog, name: str, **sampling: Any) -> dict[str, Any]:
    return {"spec": resolve(catalog, name).to_dict(), "prompt": PROMPT,
            "sampling": {**GREEDY, **sampling}}


def generate(client: EngineClient, catalog: Catalog, name: str, **kw: Any) -> dict[str, Any]:
    return client.call("generate", params(catalog, name, **kw), timeout=600)


def partial_adapter(folder: Path, base_info) -> Path:
    """Rank 8 on q and v, plus two layers this model does not have (layer 99)."""
    f.write_peft_lora(folder, base_info, seed=5, strength=0.1)
    from safetensors.numpy import load_file

    tensors = load_file(str(folder / "adapter_model.safetensors"))
    rng = np.random.default_rng(9)
    for role, out_f in (("q_proj", 576), ("v_proj", 192)):
        key = f"base_model.model.model.layers.99.self_attn.{role}"
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.05, (8, 576)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.05, (out_f, 8)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, base_info) -> Any:
    tmp = tmp_path_factory.mktemp("ov-engine")
    home = Home(tmp / "home")
    catalog = Catalog()
    register_default(catalog, tmp_path_factory)
    for name, seed in (("a", 1), ("b", 2)):
        imports.add_adapter(catalog, name, OV, f.write_peft_lora(tmp / name, base_info, seed=seed,
                                                        strength=0.1))
    imports.add_adapter(catalog, "o", OV, f.write_peft_lora(tmp / "o", base_info, seed=3, strength=0.1,
                                                   roles=("attn_output",)))
    imports.add_adapter(catalog, "partial", OV, partial_adapter(tmp / "partial", base_info))
    catalog.add_variant("va", OV, [AdapterSpec("a", 1.0)])
    catalog.add_variant("vb", OV, [AdapterSpec("b", 1.0)])
    catalog.add_variant("va0", OV, [AdapterSpec("a", 0.0)])
    catalog.add_variant("vab", OV, [AdapterSpec("a", 0.5), AdapterSpec("b", 0.5)])
    catalog.add_variant("vo", OV, [AdapterSpec("o", 1.0)])
    catalog.add_variant("vpartial", OV, [AdapterSpec("partial", 1.0)])
    client = EngineClient()
    yield catalog, client
    client.close()
    home.restore()


def test_peft_adapter_changes_output_alpha_zero_is_the_base_and_base_is_untouched(
        world) -> None:
    catalog, client = world
    base_first = generate(client, catalog, OV)
    va = generate(client, catalog, "va")
    vb = generate(client, catalog, "vb")
    va0 = generate(client, catalog, "va0")
    base_after = generate(client, catalog, OV)
    va_again = generate(client, catalog, "va")
    assert len(base_first["token_ids"]) == 20
    assert va["token_ids"] != base_first["token_ids"], "the adapter changed nothing"
    assert vb["token_ids"] != va["token_ids"], "two adapters gave the same output"
    assert va0["token_ids"] == base_first["token_ids"], "alpha 0 must equal the base"
    assert va0["logprobs"] == base_first["logprobs"]
    assert base_after["token_ids"] == base_first["token_ids"], "variant state leaked"
    assert base_after["logprobs"] == base_first["logprobs"]
    assert va_again["token_ids"] == va["token_ids"], "greedy output must be reproducible"
    for result in (base_first, va, vb, va0):
        assert result["backend"] == "openvino"
    assert len({r["identity"] for r in (base_first, va, vb, va0)}) == 4
    assert resolve.identity(catalog, "va").runtime.startswith("openvino-genai/2026.4")


def test_every_tensor_attaches_and_openvino_genai_agrees_with_no_warning(world) -> None:
    catalog, client = world
    show = catalog.adapter("a")["checks"]
    assert {"name": "coverage", "status": "pass",
            "detail": "120 of 120 tensors attach to 60 OpenVINO layers"} in show
    va = resolve(catalog, "va").to_dict()
    result = client.call("cross_check", {"first": va, "second": va, "prompts": [PROMPT],
                                         "tokens": 12, "genai": True}, timeout=900)
    genai = result["genai"]
    assert genai["mode"] == "MODE_DYNAMIC"
    assert genai["unused_tensors"] == [] and genai["warnings"] == []
    assert not any("unused LoRA" in line for line in genai["stderr"])
    # OpenVINO GenAI's own MODE_DYNAMIC LoRA and our LoRA branches pick the same tokens.
    ours = result["prompts"][0]["second"]
    assert len(ours) == 12 and genai["tokens"][0][:8] == ours[:8]
    registered = client.call("describe", timeout=60)["residents"][0]["adapters_registered"]
    a = next(r for r in registered if r["name"] == "a")
    assert (a["attached_tensors"], a["total_tensors"]) == (120, 120)


def test_openvino_warnings_about_unused_tensors_are_captured_not_lost(world) -> None:
    catalog, client = world
    coverage = next(c for c in catalog.adapter("partial")["checks"] if c["name"] == "coverage")
    assert coverage["status"] == "warn"
    assert coverage["detail"].startswith("partial coverage: 120 of 124 tensors attach")
    spec = resolve(catalog, "vpartial").to_dict()
    result = client.call("cross_check", {"first": spec, "second": spec, "prompts": [PROMPT],
                                         "tokens": 4, "genai": True}, timeout=900)
    genai = result["genai"]
    # OpenVINO names the unused layer keys (A and B together).
    assert sorted(genai["unused_tensors"]) == [
        f"base_model.model.model.layers.99.self_attn.{r}" for r in ("q_proj", "v_proj")]
    assert any("There unused LoRA tensors" in line for line in genai["warnings"])
    assert genai["tokens"][0] == result["prompts"][0]["second"]


def test_compare_runs_base_and_variant_side_by_side_on_openvino(world) -> None:
    catalog, client = world
    events: list[dict] = []
    result = client.submit("compare", params(catalog, "va"), events.append).wait(900)
    base = generate(client, catalog, OV)
    variant = generate(client, catalog, "va")
    assert result["base"]["token_ids"] == base["token_ids"]
    assert result["variant"]["token_ids"] == variant["token_ids"]
    assert result["base"]["backend"] == result["variant"]["backend"] == "openvino"
    assert result["variant"]["identity"] == resolve.identity(catalog, "va").key
    div = result["first_divergence"]
    assert div is not None and base["token_ids"][:div] == variant["token_ids"][:div]
    assert result["adapter_effect"] > 0.05
    for side in ("base", "variant"):
        r = result[side]
        assert len(r["logprobs"]) == len(r["token_ids"]) and all(lp <= 0 for lp in r["logprobs"])
        assert r["tokens_per_second"] > 0
    assert {e["side"] for e in events if e["event"] == "token"} == {"base", "variant"}
    zero = client.call("compare", params(catalog, "va0"), timeout=900)
    assert zero["first_divergence"] is None and zero["adapter_effect"] == 0.0


def test_compiled_model_is_rebuilt_only_when_new_layers_need_lora(world) -> None:
    catalog, _ = world
    client = EngineClient()
    try:
        def resident() -> dict:
            (only,) = client.call("describe", timeout=60)["residents"]
            return only

        base = generate(client, catalog, OV)
        assert (resident()["pipeline_builds"], resident()["lora_layers"]) == (1, 0)
        generate(client, catalog, "va")  # q and v of every layer: the set grows
        assert (resident()["pipeline_builds"], resident()["lora_layers"]) == (2, 60)
        generate(client, catalog, "vb")  # another adapter on the same layers
        generate(client, catalog, "vab")
        assert resident()["pipeline_builds"] == 2
        assert generate(client, catalog, OV)["token_ids"] == base["token_ids"]
        generate(client, catalog, "vo")  # o_proj: new layers
        assert (resident()["pipeline_builds"], resident()["lora_layers"]) == (3, 90)
        assert generate(client, catalog, OV)["token_ids"] == base["token_ids"]
        names = {r["name"] for r in resident()["adapters_registered"]}
        assert names == {"a", "b", "o"}
    finally:
        client.close()
    client = EngineClient()
    try:  # a variant opened first: one build that already has its branches
        first = generate(client, catalog, "vb")
        (only,) = client.call("describe", timeout=60)["residents"]
        assert (only["pipeline_builds"], only["lora_layers"]) == (1, 60)
        assert generate(client, catalog, OV)["token_ids"] == base["token_ids"]
        assert generate(client, catalog, "vb")["token_ids"] == first["token_ids"]
        assert client.call("describe", timeout=60)["residents"][0]["pipeline_builds"] == 1
    finally:
        client.close()


def test_sampling_is_seeded_and_stop_strings_end_text_on_openvino(world) -> None:
    catalog, client = world
    one = generate(client, catalog, "vb", temperature=0.9, seed=42, top_k=40, top_p=0.9)
    two = generate(client, catalog, "vb", temperature=0.9, seed=42, top_k=40, top_p=0.9)
    other = generate(client, catalog, "vb", temperature=0.9, seed=43, top_k=40, top_p=0.9)
    assert one["token_ids"] == two["token_ids"] and one["token_ids"] != other["token_ids"]
    full = generate(client, catalog, OV)
    word = full["text"].split()[3]
    stopped = generate(client, catalog, OV, stop=[word])
    assert stopped["finish_reason"] == "stop" and word not in stopped["text"]
    assert full["text"].startswith(stopped["text"])


def test_cancel_stops_an_openvino_generation(world) -> None:
    catalog, client = world
    after: list[dict] = []
    cancelled = threading.Event()
    holder: dict = {}

    def on_event(event: dict) -> None:
        if cancelled.is_set():
            after.append(event)
        elif event["event"] == "token" and event["index"] == 2:
            cancelled.set()
            client.cancel(holder["handle"])

    holder["handle"] = client.submit("generate", params(catalog, "va", max_tokens=2000),
                                     on_event)
    with pytest.raises(Cancelled):
        holder["handle"].wait(600)
    assert [e["event"] for e in after] == ["cancelled"]
    assert generate(client, catalog, "va", max_tokens=3)["finish_reason"] == "length"


def test_status_and_changed_adapters_on_openvino(world) -> None:
    catalog, client = world
    client.call("close_all", timeout=60)
    generate(client, catalog, "vab", max_tokens=2)
    info = client.call("describe", timeout=60)
    (resident,) = info["residents"]
    assert resident["backend"] == "openvino" and resident["base"] == OV
    assert resident["sha256"] == catalog.model(OV)["sha256"]
    (session,) = info["sessions"]
    assert session["backend"] == "openvino" and session["identity"] == resolve.identity(catalog, "vab").key
    assert [(a["name"], a["scale"]) for a in session["adapters"]] == [("a", 0.5), ("b", 0.5)]
    # A stored adapter that changed after import is refused before OpenVINO sees it.
    client.call("close_all", timeout=60)
    config = Path(catalog.adapter("b")["path"]).with_name("adapter_config.json")
    original = config.read_bytes()
    try:
        config.write_bytes(original.replace(b'"lora_alpha": 16.0', b'"lora_alpha": 64.0'))
        with pytest.raises(RefusedError, match="adapter_config.json changed on disk"):
            generate(client, catalog, "vb")
    finally:
        config.write_bytes(original)
    assert generate(client, catalog, "vb", max_tokens=2)["token_ids"]
