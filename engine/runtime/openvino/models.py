"""OpenVINO bases made from GGUF files: refused up front, built once, recorded with
their profiles and a default profile chosen by measurement.

`variant-studio model add NAME --file X.gguf --backend openvino` (and the app's "Add base
model" with OpenVINO as the default backend) come here. The file is first resolved
against its family (`architecture.describe`) and refused, with the reason, when OpenVINO
cannot compute it as llama.cpp does (`capabilities.SERVE_OPENVINO`: a family GenAI's GGUF
reader does not know, YaRN or LongRoPE scaling, a layout it reads differently); nothing
is written then. Otherwise the engine process builds the named IR (`build.py`: layers
named by structure so PEFT adapters attach, llama.cpp's rotary table) and its compressed
profiles, reporting progress, and the record is added as the curated default's is: its
path is the named F16 IR (the exact profile) in the build cache, its `built_from` names
the GGUF (so a llama.cpp model of the same file is its counterpart), its `profiles` the
three IR folders with their digests, and its `default_profile` the one `probe` measured
faster on this CPU among those that compute the file's own numbers (`default_profile`).

Client side: OpenVINO is never imported here (the build runs in the engine process, the
measurements in children).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.catalog import digest, imports
from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.runtime.openvino import build, compress, probe
from engine.state import paths

Progress = Callable[[str, float], None]
# Builds the IR and profiles of a GGUF (the engine's `BuildOpenVino`), returning
# `build.BuildResult.to_dict()`.
Builder = Callable[[Path, Progress | None], dict[str, Any]]


def engine_builder(source: Path, progress: Progress | None) -> dict[str, Any]:
    """Ask an engine process to build `source`'s IR and profiles, relaying its progress."""
    from engine.runtime import messages
    from engine.runtime.client import run_once

    def on_event(event: messages.Event) -> None:
        if progress is not None and isinstance(event, messages.Progress):
            progress(event.stage, event.fraction)

    return run_once(messages.BuildOpenVino(str(source)), on_event)


def add_model(catalog: Catalog, name: str, file: Path, backend: str | None = None,
              source: str | None = None, curated: bool = False,
              progress: digest.Progress | None = None,
              cancelled: digest.CancelCheck | None = None,
              stages: Progress | None = None) -> dict[str, Any]:
    """`model add`: a GGUF for OpenVINO is built into a named IR first (`add_gguf`, its
    stages reported to `stages`); anything else is registered as it is
    (`imports.add_model`, hashing reported to `progress`)."""
    if backend == "openvino" and is_gguf(file):
        return add_gguf(catalog, name, file, source, curated=curated, progress=stages)
    return imports.add_model(catalog, name, file, backend, source, curated,
                             progress=progress, cancelled=cancelled)


def is_gguf(file: Path) -> bool:
    """The file is a GGUF (by its magic; a folder or an unreadable path is not)."""
    try:
        with Path(file).expanduser().open("rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


def add_gguf(catalog: Catalog, name: str, file: Path, source: str | None = None,
             builder: Builder | None = None, progress: Progress | None = None,
             curated: bool = False) -> dict[str, Any]:
    """Add a GGUF as an OpenVINO base: refused with the reason, or built and recorded.

    The name and the file are checked, and the family's support decided, before anything
    is hashed or built; a refusal or a failed build leaves the catalog as it was (a
    finished build stays in the cache for the next try).
    """
    paths.check_name(name, "model name")
    catalog.check_free(name)
    file = Path(file).expanduser().absolute()
    info = artifacts.inspect_path(file)
    if isinstance(info, AdapterInfo):
        raise RefusedError(f"{file.name} is a LoRA adapter, not a base model "
                           "(use `adapter add`)")
    if not isinstance(info, BaseModelInfo) or info.format != "gguf":
        raise RefusedError(f"{file.name} is not a GGUF base model")
    build.describe_for_openvino(file)  # the family and its RoPE: refused here, with why
    result = build.BuildResult.from_dict((builder or engine_builder)(file, progress))
    # A build found in the cache names the path it was first built from: this one's.
    result = replace(result, source_path=str(file))
    folder = Path(result.folder)
    exact = {"path": str(folder), "sha256": digest.content_digest(folder)}
    profiles = profile_records(result, exact)
    extra = {
        "profiles": profiles,
        "default_profile": default_profile(profiles),
        "built_from": built_from(result),
    }
    return imports.add_model(
        catalog, name, folder, "openvino",
        source or f"built from {file} ({result.recipe}, OpenVINO GenAI "
                  f"{result.openvino_version})", curated=curated, extra=extra)


def built_from(result: build.BuildResult, model: str | None = None) -> dict[str, Any]:
    """A record's `built_from`: the GGUF it was made from and how."""
    return {"path": result.source_path, "sha256": result.source_sha256, "model": model,
            "recipe": result.recipe, "openvino_genai": result.openvino_version,
            "f16_gguf": result.f16_gguf, "layers_named": result.naming.renamed,
            "names_cross_checked": result.naming.cross_checked,
            "rope": result.naming.rope}


def profile_records(result: build.BuildResult, exact: dict[str, Any]
                    ) -> dict[str, dict[str, Any]]:
    """The `profiles` field of a built record: each profile's IR folder, its digest (the
    identity covers the bytes served), weights and precisions. The compressed profiles
    compute at the precision that is safe and fastest on this machine, found once by a
    child process (`probe`, on the int4 IR)."""
    out: dict[str, dict[str, Any]] = {}
    precision = probe.preferred_precision(Path(result.profiles[compress.FAST]["folder"]))
    for name, made in result.profiles.items():
        folder = Path(made["folder"])
        out[name] = {"weights": made["weights"], "precision": precision,
                     "dynamic_quantization": compress.DYNAMIC_QUANTIZATION[name],
                     "kv_cache": made["kv_cache"], "path": str(folder),
                     "sha256": digest.content_digest(folder), "size": made["size"],
                     "recipe": made["recipe"], "nncf": made["nncf"],
                     "layers": made["layers"]}
    out[compress.EXACT] = {"weights": "f16", "precision": "f32", "kv_cache": "f32",
                           "path": exact["path"], "sha256": exact["sha256"],
                           "size": (Path(exact["path"]) / "openvino_model.bin").stat().st_size,
                           "recipe": result.recipe}
    return out


def default_profile(profiles: dict[str, dict[str, Any]]) -> str:
    """The serving profile of a built base.

    `fast` (int4) is a candidate only where it carries the source's own codes (every int4
    projection snapped to the file's Q4_1 blocks, `compress.snap_to_source`); from any
    other file NNCF re-quantizes the weights to 4 bits and computes another model (KL 0.46
    and 0.65 nats from llama.cpp on the Q8_0 and Q4_K_M fixtures, against 0.007 and 0.009
    for `fast-int8`), so `fast-int8` serves, unmeasured. Otherwise the profile this CPU
    steps faster (`probe.preferred_profile`: the one-token steps of both timed side by side,
    once per CPU and model size; `fast-int8` unless `fast` is 10 % faster)."""
    fast, int8 = profiles[compress.FAST], profiles[compress.FAST_INT8]
    layers = fast.get("layers") or {}
    if not layers.get("int4") or layers.get("snapped_to_source", 0) < layers["int4"]:
        return compress.FAST_INT8
    return probe.preferred_profile(Path(fast["path"]), Path(int8["path"]),
                                   fast["precision"]).profile
