"""Helpers for tests that drive the real engine process on the embedded model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.catalog import imports
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests import factories as f

BASE = DEFAULT_MODEL_NAME
PROMPT = messages.Prompt("Write a short poem about the sea.", chat=True)
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 24, "repeat_penalty": 1.0}
TIMEOUT = 300


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


def sampling(**changes: Any) -> Sampling:
    """Greedy sampling of 24 tokens, with `changes` on top (`stop` may be a list)."""
    return Sampling.from_dict({**GREEDY, **changes})


def request(catalog: Catalog, name: str, prompt: messages.Prompt | None = None,
            kind: type[messages.Generate] = messages.Generate, n_ctx: int | None = None,
            backend: str | None = None, **changes: Any) -> messages.Generate:
    """A Generate (or Compare) request for `name`: greedy unless `changes` say otherwise."""
    return kind(resolve(catalog, name, n_ctx, backend), prompt or PROMPT, sampling(**changes))


def generate(client: EngineClient, catalog: Catalog, name: str, **kw: Any) -> dict[str, Any]:
    return client.call(request(catalog, name, **kw), timeout=TIMEOUT)


def tokens_of(events: list[messages.Event]) -> list[messages.Token]:
    return [e for e in events if isinstance(e, messages.Token)]
