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
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import digest
from engine.formats.artifacts import BaseModelInfo
from engine.catalog.store import AdapterSpec, Catalog
from engine.runtime.client import EngineClient
from engine.errors import InspectionError, RefusedError, StudioError
from engine.catalog.resolve import resolve
from tests.test_hostile import (
from engine.curated import setup
from engine.catalog import imports
    ACCEPTED,
    BASE,
    CASES,
    Case,
    Workshop,
    build,
    mini_lora,
)

ORDER = {"adapter": 0, "variant": 1, "peft": 2, "model": 3}  # keep the base resident longest
ENGINE_CASES = sorted(CASES, key=lambda c: ORDER[c.surface])
PROMPT = {"text": "Hello", "chat": True}
SAMPLING = {"temperature": 0.0, "max_tokens": 2, "repeat_penalty": 1.0}
TIMEOUT = 120  # seconds; a request still running then is a hang


@dataclass
class EngineWorld:
    catalog: Catalog
    client: EngineClient
    workshop: Workshop
    pid: int


@pytest.fixture(scope="module")
def engine_world(tmp_path_factory: pytest.TempPathFactory, base_info: BaseModelInfo,
                 embedded_path: Path) -> Iterator[EngineWorld]:
    root = tmp_path_factory.mktemp("hostile-engine")
    old = os.environ.get("VARIANT_STUDIO_HOME")
    os.environ["VARIANT_STUDIO_HOME"] = str(root / "home")
    inputs = root / "inputs"
    inputs.mkdir()
    w = Workshop(inputs, base_info, embedded_path)
    catalog = Catalog()
    setup.first_run(catalog)
    imports.add_adapter(catalog, "good", BASE, w.put("good", mini_lora()))
    catalog.add_variant("good-v", BASE, [AdapterSpec("good", 1.0)])
    client = EngineClient()
    try:
        first = client.call("generate", params(resolve(catalog, "good-v").to_dict()),
                            timeout=TIMEOUT)
        assert first["token_ids"], "the control variant must generate"
        yield EngineWorld(catalog, client, w, client.pid or 0)
    finally:
        client.close()
        if old is None:
            os.environ.pop("VARIANT_STUDIO_HOME", None)
        else:
            os.environ["VARIANT_STUDIO_HOME"] = old


def params(spec: dict[str, Any]) -> dict[str, Any]:
    spec["identity"]["context"]["n_ctx"] = 512  # small contexts keep the module quick
    return {"spec": spec, "prompt": PROMPT, "sampling": SAMPLING}


def true_digest(path: Path) -> str:
    """The file's real digest, so the engine's digest check passes and its inspection
    has to refuse the file on its own (zeros for what cannot be hashed)."""
    try:
        return digest.content_digest(path)
    except InspectionError:
        return "0" * 64


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
    path = Path(target)
    weights = path / "adapter_model.safetensors"
    if path.is_dir() and (weights.exists() or weights.is_symlink()):
        path = weights  # the engine is handed a stored PEFT adapter's weights file
    sha = true_digest(path)
    spec["name"] = f"hostile-{case.id}"
    spec["adapters"] = [{"name": "hostile", "path": str(path), "sha256": sha, "scale": 1.0,
                         "config_sha256": None}]
    spec["identity"]["adapters"] = [{"name": "hostile", "sha256": sha, "scale": 1.0}]
    return spec


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.id for c in ENGINE_CASES])
def test_hostile_input_through_the_engine(case: Case, engine_world: EngineWorld) -> None:
    world = engine_world
    target = build(case, world.workshop)
    request = params(engine_spec(case, target, world))
    expected = case.engine_outcome
    if expected == ACCEPTED:
        result = world.client.call("generate", request, timeout=TIMEOUT)
        assert 1 <= len(result["token_ids"]) <= 2 and isinstance(result["text"], str)
    else:
        # Every refusal is typed, including llama.cpp refusing a base our checks accept.
        kind = RefusedError
        with pytest.raises(StudioError) as info:
            world.client.call("generate", request, timeout=TIMEOUT)
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
            world.client.call("close_all", timeout=TIMEOUT)
            world.client.call("generate", params(resolve(world.catalog, "good-v").to_dict()),
                              timeout=TIMEOUT)
        assert "changed on disk after import" in info.value.message
    finally:
        stored.write_bytes(original)
    again = world.client.call("generate", params(resolve(world.catalog, "good-v").to_dict()),
                              timeout=TIMEOUT)
    assert again["token_ids"] and world.client.pid == world.pid


def test_scales_travel_as_numbers_not_strings(engine_world: EngineWorld) -> None:
    """A scale smuggled in as a string is refused as malformed, not an internal error."""
    spec = resolve(engine_world.catalog, "good-v").to_dict()
    spec["identity"]["adapters"][0]["scale"] = "1"
    spec["adapters"][0]["scale"] = math.nan
    with pytest.raises(RefusedError) as info:
        engine_world.client.call("generate", params(spec), timeout=TIMEOUT)
    assert info.value.message.startswith("malformed generate request")
    assert engine_world.client.pid == engine_world.pid
