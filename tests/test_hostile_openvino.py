"""The hostile PEFT inputs through the engine, on an OpenVINO session of the real
OpenVINO default.

`test_hostile_engine.py` hands every PEFT case to a llama.cpp session, where each is
refused for its format alone. Here the same files go to an OpenVINO session spec of
the OpenVINO default, with their true digests (as if the catalog had been tampered
with), so the engine's own validation must find the named reason: names that match no
layer, rank 0, wrong shapes, NaN weights, bad adapter_config.json values, malformed
safetensors. One engine process serves every case. The compiled model is loaded (with
a good adapter) before the first case, and after each refusal its registered adapters
and build count are unchanged: OpenVINO never received the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import imports
from engine.catalog.resolve import resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import openvino_default
from engine.errors import RefusedError, StudioError
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests import factories as f
from tests.engine_helpers import request
from tests.hostile_cases import (
    CASES,
    ENGINE_TIMEOUT,
    Case,
    EngineWorld,
    Workshop,
    build,
    raw_generate,
    wire_params,
    with_hostile_adapter,
)
from tests.openvino_helpers import register_default

pytestmark = pytest.mark.slow  # the OpenVINO default built and compiled first
OV = openvino_default.NAME
# Every PEFT-surface case; the expected reason is the CLI's (the same validation runs).
OV_CASES = [c for c in CASES if c.surface == "peft"]


@dataclass
class OvWorld(EngineWorld):
    compiled: dict[str, Any]  # the resident's LoRA state before any hostile case


def lora_state(client: EngineClient) -> dict[str, Any]:
    """What the OpenVINO resident has been given: adapters, LoRA layers, builds."""
    (resident,) = [r for r in client.call(messages.Describe(),
                                          timeout=ENGINE_TIMEOUT)["residents"]
                   if r["backend"] == "openvino"]
    return {"adapters": sorted(a["name"] for a in resident["adapters_registered"]),
            "lora_layers": resident["lora_layers"], "builds": resident["pipeline_builds"]}


@pytest.fixture(scope="module")
def ov_world(module_home: Path, tmp_path_factory: pytest.TempPathFactory,
             base_info: BaseModelInfo, embedded_path: Path) -> Iterator[OvWorld]:
    root = tmp_path_factory.mktemp("hostile-openvino")
    inputs = root / "inputs"
    inputs.mkdir()
    catalog = Catalog()
    register_default(catalog, tmp_path_factory)
    imports.add_adapter(catalog, "good", OV, f.write_peft_lora(root / "good", base_info,
                                                               seed=1, strength=0.1))
    catalog.add_variant("good-ov", OV, [AdapterSpec("good", 1.0)])
    client = EngineClient()
    try:
        first = client.call(request(catalog, "good-ov", messages.Prompt("Hello", chat=True),
                                    n_ctx=512, max_tokens=2), timeout=600)
        assert first["token_ids"] and first["backend"] == "openvino"
        compiled = lora_state(client)
        assert compiled["adapters"] == ["good"] and compiled["lora_layers"] > 0
        yield OvWorld(catalog, client, Workshop(inputs, base_info, embedded_path),
                      client.pid or 0, compiled)
    finally:
        client.close()


def hostile_spec(world: OvWorld, target: Path) -> dict[str, Any]:
    """The good OpenVINO variant's spec with its adapter replaced by the hostile file."""
    return with_hostile_adapter(resolve(world.catalog, "good-ov").to_dict(), target, "hostile")


@pytest.mark.parametrize("case", OV_CASES, ids=[c.id for c in OV_CASES])
def test_hostile_peft_is_refused_by_the_engine_before_openvino_sees_it(
        case: Case, ov_world: OvWorld) -> None:
    world = ov_world
    spec = hostile_spec(world, Path(build(case, world.workshop)))
    assert spec["identity"]["backend"] == "openvino" and spec["base_name"] == OV
    with pytest.raises(StudioError) as info:
        raw_generate(world.client, wire_params(spec))
    error = info.value
    assert isinstance(error, RefusedError), f"{type(error).__name__}: {error.message}"
    assert case.cli.removeprefix("refused: ") in error.message, error.message
    assert "runs on llama.cpp" not in error.message  # judged against OpenVINO, not llama.cpp
    assert error.message.isprintable(), repr(error.message)
    # OpenVINO never got the file: nothing registered, no LoRA branch, no rebuild.
    assert lora_state(world.client) == world.compiled
    # The engine survived: same process, still serving.
    assert world.client.pid == world.pid and world.client.starts == 1
    assert world.client.state == "running"
