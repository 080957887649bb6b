"""Helpers for tests that drive the real engine process on the embedded model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.formats.artifacts import BaseModelInfo
from engine.catalog.store import AdapterSpec, Catalog
from engine.runtime.client import EngineClient
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.catalog.resolve import resolve
from tests import factories as f
from engine.curated import setup
from engine.catalog import imports

BASE = DEFAULT_MODEL_NAME
PROMPT = {"text": "Write a short poem about the sea.", "chat": True}
GREEDY = {"temperature": 0.0, "max_tokens": 24, "repeat_penalty": 1.0}


def populate(catalog: Catalog, tmp: Path, base: BaseModelInfo) -> None:
    """Adapters a (seed 1) and b (seed 2), and variants over them."""
    setup.first_run(catalog)
    for name, seed in (("a", 1), ("b", 2)):
        path = f.write_gguf_lora(tmp / f"{name}.gguf", base, seed=seed, strength=0.1)
        imports.add_adapter(catalog, name, BASE, path)
    catalog.add_variant("va", BASE, [AdapterSpec("a", 1.0)])
    catalog.add_variant("vb", BASE, [AdapterSpec("b", 1.0)])
    catalog.add_variant("va0", BASE, [AdapterSpec("a", 0.0)])
    catalog.add_variant("vab", BASE, [AdapterSpec("a", 0.5), AdapterSpec("b", 0.5)])


def params(catalog: Catalog, name: str, prompt: dict | None = None, **sampling: Any
           ) -> dict[str, Any]:
    return {"spec": resolve(catalog, name).to_dict(), "prompt": prompt or PROMPT,
            "sampling": {**GREEDY, **sampling}}


def generate(client: EngineClient, catalog: Catalog, name: str, **kw: Any) -> dict[str, Any]:
    return client.call("generate", params(catalog, name, **kw), timeout=300)
