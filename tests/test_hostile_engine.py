"""The hostile-input table through the real engine process.

The engine never trusts the client: it re-hashes every file named in a session
specification and inspects and validates it again before llama.cpp sees it. Here each
case's file is handed to the engine directly, with its *true* digest (as if the
catalog itself had been tampered with or the file swapped together with its record),
so only the engine's own checks stand between the file and llama.cpp. One engine
process serves the whole module: every refusal must leave it running (same pid, no
restart), and accepted inputs must generate normally.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import imports
from engine.catalog.resolve import resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.errors import RefusedError, StudioError
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests.engine_helpers import request as typed_request
from tests.hostile_cases import (
    ACCEPTED,
    BASE,
    CASES,
    ENGINE_TIMEOUT,
    Case,
    EngineWorld,
    Workshop,
    build,
    mini_lora,
    raw_generate,
    true_digest,
    wire_params,
    with_hostile_adapter,
)

ORDER = {"adapter": 0, "variant": 1, "peft": 2, "model": 3}  # keep the base resident longest
ENGINE_CASES = sorted(CASES, key=lambda c: ORDER[c.surface])
TIMEOUT = ENGINE_TIMEOUT


@pytest.fixture(scope="module")
def engine_world(module_home: Path, tmp_path_factory: pytest.TempPathFactory,
                 base_info: BaseModelInfo, embedded_path: Path) -> Iterator[EngineWorld]:
    w = Workshop(tmp_path_factory.mktemp("hostile-engine-inputs"), base_info, embedded_path)
    catalog = Catalog()
    setup.first_run(catalog)
    imports.add_adapter(catalog, "good", BASE, w.put("good", mini_lora()))
    catalog.add_variant("good-v", BASE, [AdapterSpec("good", 1.0)])
    client = EngineClient()
    try:
        world = EngineWorld(catalog, client, w, 0)
        assert good(world)["token_ids"], "the control variant must generate"
        world.pid = client.pid or 0
        yield world
    finally:
        client.close()


def good(world: EngineWorld) -> dict[str, Any]:
    """The control variant, generating two tokens."""
    request = typed_request(world.catalog, "good-v", messages.Prompt("Hello", chat=True),
                            n_ctx=512, max_tokens=2)
    return world.client.call(request, timeout=TIMEOUT)


def engine_spec(case: Case, target: Path | str, world: EngineWorld) -> dict[str, Any]:
    if case.surface == "model":
        spec = resolve(world.catalog, BASE).to_dict()
        sha = true_digest(Path(target))
        spec.update(name=f"hostile-{case.id}", base_name="hostile", base_path=str(target))
        spec["identity"].update(base_name="hostile", base_sha256=sha)
        return spec
    spec = resolve(world.catalog, "good-v").to_dict()
    if case.surface == "variant":
        scale = float(str(target))
        spec["adapters"][0]["scale"] = scale
        spec["identity"]["adapters"][0]["scale"] = scale
        return spec
    return with_hostile_adapter(spec, Path(target), f"hostile-{case.id}")


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.id for c in ENGINE_CASES])
def test_hostile_input_through_the_engine(case: Case, engine_world: EngineWorld) -> None:
    world = engine_world
    target = build(case, world.workshop)
    params = wire_params(engine_spec(case, target, world))
    expected = case.engine_outcome
    if expected == ACCEPTED:
        result = raw_generate(world.client, params)
        assert 1 <= len(result["token_ids"]) <= 2 and isinstance(result["text"], str)
    else:
        # Every refusal is typed, including llama.cpp refusing a base our checks accept.
        kind = RefusedError
        with pytest.raises(StudioError) as info:
            raw_generate(world.client, params)
        error = info.value
        assert isinstance(error, kind), f"{type(error).__name__}: {error.message}"
        assert "engine stopped" not in error.message and "timed out" not in error.message
        assert expected.removeprefix("refused: ") in error.message, error.message
        assert error.message.isprintable(), repr(error.message)
    # The engine survived: same process, still serving.
    assert world.client.pid == world.pid and world.client.state == "running"
    assert world.client.starts == 1


def test_an_adapter_swapped_after_import_is_refused_and_the_engine_lives_on(
        engine_world: EngineWorld) -> None:
    world = engine_world
    stored = Path(world.catalog.adapter("good")["path"])
    original = stored.read_bytes()
    try:
        stored.write_bytes(original[: len(original) // 2])  # swapped for a truncated copy
        with pytest.raises(RefusedError) as info:
            world.client.call(messages.CloseAll(), timeout=TIMEOUT)
            good(world)
        assert "changed on disk after import" in info.value.message
    finally:
        stored.write_bytes(original)
    again = good(world)
    assert again["token_ids"] and world.client.pid == world.pid


def test_scales_travel_as_numbers_not_strings(engine_world: EngineWorld) -> None:
    """A scale smuggled in as a string is refused as malformed, not an internal error."""
    spec = resolve(engine_world.catalog, "good-v").to_dict()
    spec["identity"]["adapters"][0]["scale"] = "1"
    spec["adapters"][0]["scale"] = math.nan
    with pytest.raises(RefusedError) as info:
        raw_generate(engine_world.client, wire_params(spec))
    assert info.value.message.startswith("malformed generate request")
    assert engine_world.client.pid == engine_world.pid
