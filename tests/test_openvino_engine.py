"""The OpenVINO engine on the real default model, with PEFT adapters the tests write.

One engine process serves the module, as in the app: the base and its variants share
one compiled model (dynamic LoRA), each session its own KV state and adapter tensors.
What every backend does alike (variants, compare, sampling, cancel) is in
test_engine_backends.py; here is what is OpenVINO's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.catalog import imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import openvino_default
from engine.errors import RefusedError
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests import factories as f
from tests.engine_helpers import PROMPT, request
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # the OpenVINO default built and compiled
OV = openvino_default.NAME
TIMEOUT = 900  # a hang bound only


def generate(client: EngineClient, catalog: Catalog, name: str, **kw: Any) -> dict[str, Any]:
    return client.call(request(catalog, name, **{"max_tokens": 20, **kw}), timeout=TIMEOUT)


def genai_check(catalog: Catalog, name: str, tokens: int) -> messages.CrossCheck:
    """`name` against itself on OpenVINO, with OpenVINO GenAI's own LoRA run beside ours."""
    spec = resolve.resolve(catalog, name)
    return messages.CrossCheck(spec, spec, (PROMPT,), tokens, genai=True)


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


def _more_adapters(world: World) -> None:
    catalog, tmp = world.catalog, world.out
    imports.add_adapter(catalog, "o", OV, f.write_peft_lora(
        tmp / "o", world.base_info, seed=3, strength=0.1, roles=("attn_output",)))
    imports.add_adapter(catalog, "partial", OV,
                        partial_adapter(tmp / "partial", world.base_info))
    catalog.add_variant("vo", OV, [AdapterSpec("o", 1.0)])
    catalog.add_variant("vpartial", OV, [AdapterSpec("partial", 1.0)])


WORLD = Recipe(openvino=True, adapters=True, furnish=_more_adapters)


def test_every_tensor_attaches_and_openvino_genai_agrees_with_no_warning(world) -> None:
    catalog, client = world.catalog, world.engine
    show = catalog.adapter("a")["checks"]
    assert {"name": "coverage", "status": "pass",
            "detail": "120 of 120 tensors attach to 60 OpenVINO layers"} in show
    result = client.call(genai_check(catalog, "va", 12), timeout=TIMEOUT)
    genai = result["genai"]
    assert genai["mode"] == "MODE_DYNAMIC"
    assert genai["unused_tensors"] == [] and genai["warnings"] == []
    assert not any("unused LoRA" in line for line in genai["stderr"])
    # OpenVINO GenAI's own MODE_DYNAMIC LoRA and our LoRA branches pick the same tokens.
    ours = result["prompts"][0]["second"]
    assert len(ours) == 12 and genai["tokens"][0][:8] == ours[:8]
    registered = client.call(messages.Describe(), timeout=60)["residents"][0]["adapters_registered"]
    a = next(r for r in registered if r["name"] == "a")
    assert (a["attached_tensors"], a["total_tensors"]) == (120, 120)


def test_openvino_warnings_about_unused_tensors_are_captured_not_lost(world) -> None:
    catalog, client = world.catalog, world.engine
    coverage = next(c for c in catalog.adapter("partial")["checks"] if c["name"] == "coverage")
    assert coverage["status"] == "warn"
    assert coverage["detail"].startswith("partial coverage: 120 of 124 tensors attach")
    result = client.call(genai_check(catalog, "vpartial", 4), timeout=TIMEOUT)
    genai = result["genai"]
    # OpenVINO names the unused layer keys (A and B together).
    assert sorted(genai["unused_tensors"]) == [
        f"base_model.model.model.layers.99.self_attn.{r}" for r in ("q_proj", "v_proj")]
    assert any("There unused LoRA tensors" in line for line in genai["warnings"])
    assert genai["tokens"][0] == result["prompts"][0]["second"]


def test_compiled_model_is_rebuilt_only_when_new_layers_need_lora(world) -> None:
    catalog = world.catalog
    client = EngineClient()
    try:
        def resident() -> dict:
            (only,) = client.call(messages.Describe(), timeout=60)["residents"]
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
        # An adapter no session uses any more is freed (the adapter manager's eviction);
        # its layers keep their LoRA branches, so the sessions above built nothing new.
        names = {r["name"] for r in resident()["adapters_registered"]}
        live = {a["name"] for s in client.call(messages.Describe(), timeout=60)["sessions"]
                for a in s["adapters"]}
        assert names == live and "o" in names and names <= {"a", "b", "o"}
    finally:
        client.close()
    client = EngineClient()
    try:  # a variant opened first: one build that already has its branches
        first = generate(client, catalog, "vb")
        (only,) = client.call(messages.Describe(), timeout=60)["residents"]
        assert (only["pipeline_builds"], only["lora_layers"]) == (1, 60)
        assert generate(client, catalog, OV)["token_ids"] == base["token_ids"]
        assert generate(client, catalog, "vb")["token_ids"] == first["token_ids"]
        assert client.call(messages.Describe(), timeout=60)["residents"][0]["pipeline_builds"] == 1
    finally:
        client.close()


def test_status_and_changed_adapters_on_openvino(world) -> None:
    catalog, client = world.catalog, world.engine
    client.call(messages.CloseAll(), timeout=60)
    generate(client, catalog, "vab", max_tokens=2)
    info = client.call(messages.Describe(), timeout=60)
    (resident,) = info["residents"]
    assert resident["backend"] == "openvino" and resident["base"] == OV
    # The resident holds the weights served: the default profile's IR (int4 or int8,
    # whichever this CPU stepped faster: probe.preferred_profile).
    default = catalog.model(OV)["default_profile"]
    assert resident["sha256"] == catalog.model(OV)["profiles"][default]["sha256"] == (
        resolve.identity(catalog, OV).served_sha256)
    assert resident["profile"].startswith(f"{default} (")
    (session,) = info["sessions"]
    assert session["backend"] == "openvino" and session["identity"] == (
        resolve.identity(catalog, "vab").key)
    assert [(a["name"], a["scale"]) for a in session["adapters"]] == [("a", 0.5), ("b", 0.5)]
    # A stored adapter that changed after import is refused before OpenVINO sees it.
    client.call(messages.CloseAll(), timeout=60)
    config = Path(catalog.adapter("b")["path"]).with_name("adapter_config.json")
    original = config.read_bytes()
    try:
        config.write_bytes(original.replace(b'"lora_alpha": 16.0', b'"lora_alpha": 64.0'))
        with pytest.raises(RefusedError, match="adapter_config.json changed on disk"):
            generate(client, catalog, "vb")
    finally:
        config.write_bytes(original)
    assert generate(client, catalog, "vb", max_tokens=2)["token_ids"]
