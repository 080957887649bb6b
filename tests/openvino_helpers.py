"""Shared set-up for the OpenVINO tests: one build of the OpenVINO default per session.

The build cache is `<pytest basetemp>/openvino-cache` for the session (so the default
is built at most once per test session, by the first test that needs it, through the
real engine process and its progress events). Set VARIANT_STUDIO_OPENVINO_CACHE to
reuse a cache across sessions while developing. This module holds no tests.

A test that needs the default built carries `@pytest.mark.slow`: run alone, it pays
for the build, F16 IR and its int4 and int8 profiles (61 s alone on this 2-core
machine: 17 + 25 + 19 s; 115 s under load), so `pytest -m "not slow"` never builds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import imports
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import openvino_default, setup
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.openvino import build as openvino_build
from tests import factories as f

_FIRST_BUILD: dict[str, Any] = {}


def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's build cache, exported to every engine process through the env."""
    if "cache" not in _FIRST_BUILD:
        external = os.environ.get(openvino_build.CACHE_ENV)
        path = Path(external) if external else tmp_path_factory.getbasetemp() / "openvino-cache"
        os.environ[openvino_build.CACHE_ENV] = str(path)
        _FIRST_BUILD["cache"] = path
        _FIRST_BUILD["external"] = bool(external)
    return _FIRST_BUILD["cache"]


def first_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's first build of the default (through the engine), with its events."""
    if "result" not in _FIRST_BUILD:
        cache_dir(tmp_path_factory)
        events: list[messages.Event] = []
        client = EngineClient()
        try:
            handle = client.submit(openvino_default.build_request(), events.append)
            _FIRST_BUILD["result"] = handle.wait(1200)
        finally:
            client.close()
        _FIRST_BUILD["events"] = events
    return _FIRST_BUILD


def register_default(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, Any]:
    """Add the OpenVINO default to `catalog` (from the session's build cache)."""
    first_build(tmp_path_factory)
    setup.first_run(catalog)

    def no_build(progress: Any) -> dict[str, Any]:
        raise AssertionError("the OpenVINO default was built twice in one session")

    return openvino_default.ensure_default(catalog, builder=no_build)


def progress_events(build: dict[str, Any]) -> list[messages.Progress]:
    """The progress events of the session's first build."""
    return [e for e in build["events"] if isinstance(e, messages.Progress)]


def openvino_variants(catalog: Catalog, tmp: Path, base_info: BaseModelInfo) -> None:
    """On the OpenVINO default: PEFT adapters a (seed 1) and b (seed 2), and the variants
    `engine_helpers.populate` makes on llama.cpp (va, vb, va0, vab)."""
    ov = openvino_default.NAME
    for name, seed in (("a", 1), ("b", 2)):
        imports.add_adapter(catalog, name, ov, f.write_peft_lora(tmp / name, base_info,
                                                                 seed=seed, strength=0.1))
    catalog.add_variant("va", ov, [AdapterSpec("a", 1.0)])
    catalog.add_variant("vb", ov, [AdapterSpec("b", 1.0)])
    catalog.add_variant("va0", ov, [AdapterSpec("a", 0.0)])
    catalog.add_variant("vab", ov, [AdapterSpec("a", 0.5), AdapterSpec("b", 0.5)])
