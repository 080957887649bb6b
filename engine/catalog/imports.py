"""Importing artifacts into the catalog: base models, adapters, an adapter's file for
the other backend, and conversions between GGUF and PEFT.

Every adapter goes through one staging pipeline (`_stage_adapter`): inspect the source
(fail fast), copy it into a staging folder of the store under fixed names, inspect and
validate the *copied* bytes against the base, hash them, then rename the folder into
place and record it under the catalog's lock. Any refusal, error or cancel removes the
staging folder, so nothing partial is ever left in the store or the catalog.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog import digest, validation
from engine.catalog.resolve import counterpart
from engine.catalog.store import BACKENDS, Catalog, now_iso
from engine.catalog.trust.policy import check_import, import_check_row
from engine.catalog.trust.policy import policy as signature_policy
from engine.catalog.trust.records import import_record, take_signed_files
from engine.catalog.trust.verify import PROVENANCE_FILE, Verdict
from engine.errors import Cancelled, RefusedError, StudioError, UnknownNameError, UsageError
from engine.formats import artifacts, lora_io
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.safeio import open_regular
from engine.state import paths
from engine.state.statefile import write_json_atomic

# --------------------------------------------------------------------------- base models


def add_model(
    catalog: Catalog,
    name: str,
    file: Path,
    backend: str | None = None,
    source: str | None = None,
    curated: bool = False,
    progress: digest.Progress | None = None,
    cancelled: digest.CancelCheck | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Register a base model where it is (it is not copied: it is re-verified by digest)."""
    paths.check_name(name, "model name")
    catalog.check_free(name)
    file = Path(file).expanduser().absolute()
    record = model_record(name, file, backend, source or str(file), curated, progress,
                          cancelled)
    record.update(extra or {})  # e.g. how a built model was made (built_from)
    catalog.insert("models", record, check=lambda: _check_cancelled(cancelled, name))
    return record


def model_record(name: str, file: Path, backend: str | None, source: str, curated: bool,
                 progress: digest.Progress | None = None,
                 cancelled: digest.CancelCheck | None = None) -> dict[str, Any]:
    """Inspect and hash a base model file into its catalog record (nothing is written)."""
    info = artifacts.inspect_path(file)
    if isinstance(info, AdapterInfo):
        raise RefusedError(f"{file.name} is a LoRA adapter, not a base model "
                           f"(use `adapter add`)")
    if backend is None:
        backend = "openvino" if info.format == "openvino" else "llama"
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} (llama or openvino)")
    if backend == "llama" and info.format != "gguf":
        raise RefusedError(f"{file.name}: llama.cpp serves GGUF files, this is {info.format}")
    sha = digest.content_digest(file, progress, cancelled)
    return {
        "name": name,
        "kind": "model",
        "backend": backend,
        "format": info.format,
        "path": str(file),
        "sha256": sha,
        "size": _size(file),
        "source": source,
        "installed_at": now_iso(),
        "curated": curated,
        "metadata": info.summary(),
    }


# --------------------------------------------------------------------------- adapters


@dataclass(frozen=True)
class Staged:
    """An adapter copied, validated and hashed, renamed into its store folder."""

    folder: Path
    path: Path  # the weights file inside `folder`
    info: AdapterInfo
    report: validation.Report
    sha256: str
    config_sha256: str | None
    provenance: dict[str, Any] | None = None  # arrived with a signature (signed bytes)
    signature: Verdict | None = None  # when the policy or a signature asked


def _stage_adapter(file: Path, staging_root: Path, final: Path, base_record: dict[str, Any],
                   base_info: BaseModelInfo, *, strict: bool,
                   provenance: dict[str, Any] | None, progress: digest.Progress | None,
                   cancelled: digest.CancelCheck | None,
                   signature_check: Callable[[Path, dict[str, Any] | None,
                                              dict[str, str]],
                                             Verdict | None] | None = None
                   ) -> Staged:
    """The one import pipeline: inspect, copy, validate and hash the copy, rename to
    `final`. Refusal, error or cancel leave nothing behind.

    A signature in the source's folder comes along with its signed provenance.json
    (`trust.records.take_signed_files`); `signature_check(staging, provenance, digests)`
    then applies the signature policy to the staged copy before it is renamed into
    place (a refusal raises there)."""
    file = Path(file).expanduser().absolute()
    first = artifacts.inspect_path(file)  # fail fast, before copying anything
    if isinstance(first, BaseModelInfo):
        raise RefusedError(f"{file.name} is a base model ({first.architecture}, "
                           f"{first.block_count} layers), not an adapter")
    staging_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=staging_root))
    try:
        # Three passes over the bytes (copy, value scan, hash), one progress bar.
        stored = _copy_adapter(first, staging, _phase(progress, 0, 3), cancelled)
        arrived = take_signed_files(Path(first.path).parent, staging, provenance)
        if provenance is not None and not (staging / PROVENANCE_FILE).exists():
            write_json_atomic(staging / "provenance.json", provenance)
        info = artifacts.inspect_path(stored)  # validate the bytes we will serve
        if not isinstance(info, AdapterInfo):
            raise RefusedError(f"{file.name} changed while it was imported")
        report = validation.check_adapter(info, base_info, base_record["backend"],
                                          base_record["sha256"], strict=strict,
                                          progress=_phase(progress, 1, 3),
                                          cancelled=cancelled)
        if not report.ok:
            raise RefusedError(report.reason(), details=tuple(
                f"{c.name}: {c.detail}" for c in report.failures()))
        sha = digest.sha256_file(Path(info.path), _phase(progress, 2, 3), cancelled)
        config_sha = (digest.sha256_file(Path(info.config_path), cancelled=cancelled)
                      if info.config_path else None)
        verdict = None
        if signature_check is not None:
            expect = {Path(info.path).name: sha}
            if config_sha:
                expect["adapter_config.json"] = config_sha
            verdict = signature_check(staging, provenance if provenance is not None
                                      else arrived, expect)
        if final.exists():
            shutil.rmtree(final)  # a leftover from an interrupted removal
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _keep_digests(info, final)
    return Staged(final, final / Path(info.path).name, info, report, sha, config_sha,
                  arrived, verdict)


def _record_or_discard(catalog: Catalog, mutate: Callable[[dict], dict], stored: Path) -> None:
    """Apply `mutate` to the catalog; if that fails, remove the copy stored for it,
    so a refused or interrupted import leaves no orphan files behind."""
    try:
        catalog.state.update(mutate)
    except BaseException:
        shutil.rmtree(stored, ignore_errors=True)
        raise


def add_adapter(
    catalog: Catalog,
    name: str,
    base: str,
    file: Path,
    source: str | None = None,
    strict: bool = False,
    curated: bool = False,
    default_scale: float = 1.0,
    progress: digest.Progress | None = None,
    cancelled: digest.CancelCheck | None = None,
    provenance: dict[str, Any] | None = None,
    shipped: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Copy, inspect and validate an adapter, then add it. Refusal changes nothing.

    `extra` fields are kept in the record (a download's `download`: URL or repo and
    commit).

    A `provenance` record is stored in the catalog and as `provenance.json` beside
    the stored file. `shipped` adapters (the app's own demo) are stored under
    `<data>/shipped/` rather than `<data>/adapters/`. The catalog's signature policy
    applies (`trust.policy.check_import`): a signature arrives as `signature.sig` in the
    source's folder, with the signed `provenance.json` beside it; curated adapters
    need a valid signature by the shipped release key.
    """
    paths.check_name(name, "adapter name")
    catalog.check_free(name)
    base_record = catalog.model(base)
    validation.require_scale(default_scale, "default scale")
    status = catalog.verify_base(base)
    if not status.ok:
        raise RefusedError(f"base {base}: {status.detail}")
    store_root = paths.data_dir() / ("shipped" if shipped else "adapters")
    policy = signature_policy(catalog)

    def signature_check(folder: Path, arrived: dict[str, Any] | None,
                        expect: dict[str, str]) -> Verdict | None:
        return check_import(catalog, name, folder, curated=curated, provenance=arrived,
                            expect=expect)

    staged = _stage_adapter(file, store_root, store_root / name, base_record,
                            catalog.base_info(base_record), strict=strict or curated,
                            provenance=provenance, progress=progress, cancelled=cancelled,
                            signature_check=signature_check)
    info = staged.info
    if provenance is None:
        provenance = staged.provenance
    record = {
        "name": name,
        "kind": "adapter",
        "backend": info.backend,
        "format": info.format,
        "path": str(staged.path),
        "sha256": staged.sha256,
        "config_sha256": staged.config_sha256,
        "size": _size(staged.folder),
        "source": source or str(Path(file).expanduser().absolute()),
        "installed_at": now_iso(),
        "curated": curated,
        "base": base,
        "base_sha256": base_record["sha256"],
        "expected_base_sha256": info.base_sha256,
        "verified": info.base_sha256 == base_record["sha256"],
        "default_scale": float(default_scale),
        "metadata": info.summary(),
        "checks": staged.report.to_list(),
    }
    if provenance is not None:
        record["provenance"] = provenance
    record.update(extra or {})
    if staged.signature is not None:
        if staged.signature.status != "unsigned":
            record["signature"] = import_record(staged.signature)
        record["checks"].append(import_check_row(staged.signature, policy))

    def insert(data: dict) -> dict:
        _check_cancelled(cancelled, name)  # under the lock: cancelled means not added
        catalog.check_free(name, data)
        data["adapters"][name] = record
        return data

    _record_or_discard(catalog, insert, staged.folder)
    return record


def add_adapter_file(catalog: Catalog, name: str, base: str, file: Path,
                     source: str | None = None, progress: digest.Progress | None = None,
                     cancelled: digest.CancelCheck | None = None,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Give adapter `name` a file for another backend, validated against `base`.

    The file is copied into `<store>/NAME/<backend>/`, checked there against `base`
    (which must be the counterpart of the adapter's own base), and recorded with its
    own digest under `files[backend]`. Refusal changes nothing.
    """
    record = catalog.adapter(name)
    base_record = catalog.model(base)
    backend = base_record["backend"]
    if backend == record["backend"]:
        raise UsageError(f"adapter {name} already is a {backend} adapter")
    if counterpart(catalog, record["base"], backend) != base:
        raise RefusedError(f"{base} does not serve the same weights as {record['base']}, "
                           f"the base adapter {name} was made for")
    status = catalog.verify_base(base)
    if not status.ok:
        raise RefusedError(f"base {base}: {status.detail}")
    staged = _stage_adapter(file, paths.adapter_store(name), paths.adapter_store(name) / backend,
                            base_record, catalog.base_info(base_record), strict=False,
                            provenance=None, progress=progress, cancelled=cancelled)
    entry = {
        "backend": backend, "format": staged.info.format,
        "path": str(staged.path), "sha256": staged.sha256,
        "config_sha256": staged.config_sha256, "size": _size(staged.folder),
        "source": source or str(Path(file).expanduser().absolute()), "installed_at": now_iso(),
        "base": base, "base_sha256": base_record["sha256"],
        "metadata": staged.info.summary(), "checks": staged.report.to_list(),
    }
    entry.update(extra or {})  # how a converted file was made (converted_from)

    def insert(data: dict) -> dict:
        _check_cancelled(cancelled, name)
        if name not in data["adapters"]:
            raise UnknownNameError(f"adapter {name} was removed meanwhile")
        data["adapters"][name].setdefault("files", {})[backend] = entry
        return data

    _record_or_discard(catalog, insert, staged.folder)
    return entry


def convert_adapter(catalog: Catalog, name: str, backend: str, base: str | None = None,
                    progress: digest.Progress | None = None,
                    cancelled: digest.CancelCheck | None = None) -> dict[str, Any]:
    """Convert adapter `name`'s stored file to `backend`'s format and add it.

    GGUF <-> PEFT, with llama.cpp's q/k row permutation undone or applied on the B
    halves where the family permutes them (see `engine.formats.lora_io`); the family and
    head counts come from the adapter's base's record (an adapter for another family is
    refused).
    """

    record = catalog.adapter(name)
    own_base = catalog.model(record["base"])
    target = base or counterpart(catalog, record["base"], backend)
    if target is None:
        raise RefusedError(f"{record['base']} has no counterpart on {backend}")
    meta = own_base["metadata"]
    # How it is made, recorded so the engine can make it again from the signed file
    # and compare (a conversion is covered by its source's signature).
    made = {"sha256": record["sha256"], "n_head": int(meta["head_count"]),
            "n_head_kv": int(meta["head_count_kv"]),
            "architecture": str(meta.get("architecture")),
            "rebase": [own_base["sha256"], catalog.model(target)["sha256"]]}
    paths.adapter_store(name).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=paths.adapter_store(name)) as tmp:
        _check_cancelled(cancelled, name)
        converted = lora_io.convert_file(
            Path(record["path"]), Path(tmp) / ("peft" if backend == "openvino"
                                              else "adapter.gguf"),
            lora_io.Layout.of(made["architecture"], made["n_head"], made["n_head_kv"]),
            rebase=(made["rebase"][0], made["rebase"][1]))
        return add_adapter_file(catalog, name, target, converted,
                                f"converted from {name} ({record['format']}, sha256 "
                                f"{record['sha256'][:16]}…)", progress, cancelled,
                                extra={"converted_from": made})


# --------------------------------------------------------------------------- helpers


def _copy_adapter(info: AdapterInfo, staging: Path, progress: digest.Progress | None,
                  cancelled: digest.CancelCheck | None) -> Path:
    """Copy the adapter's files into `staging`; returns the stored weights path.

    Store names are fixed, never taken from the source file or its metadata.
    """
    source = Path(info.path)
    target = staging / ("adapter.gguf" if info.format == "gguf"
                        else "adapter_model.safetensors")
    _copy_file(source, target, progress, cancelled)
    if info.config_path:
        _copy_file(Path(info.config_path), staging / "adapter_config.json", None, cancelled)
    return target


def _copy_file(source: Path, target: Path, progress: digest.Progress | None,
               cancelled: digest.CancelCheck | None) -> None:
    handle, st = open_regular(source)
    done = 0
    with handle, open(target, "wb") as out:
        while chunk := handle.read(digest.CHUNK):
            if cancelled and cancelled():
                raise Cancelled(f"import of {source.name} was cancelled")
            out.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, st.size)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _check_cancelled(cancelled: digest.CancelCheck | None, what: str) -> None:
    if cancelled and cancelled():
        raise Cancelled(f"{what}: cancelled")


def _phase(progress: digest.Progress | None, index: int, count: int
           ) -> digest.Progress | None:
    """Progress of pass `index` of `count` equal passes over the same bytes."""
    if progress is None:
        return None
    return lambda done, total: progress(index * total + done, count * total)


def _keep_digests(info: AdapterInfo, folder: Path) -> None:
    """The staged files were renamed into `folder`: keep their cached digests, so the
    first check of the stored copy does not read it all again."""
    for staged in (info.path, info.config_path):
        if staged:
            try:
                digest.moved(Path(staged), folder / Path(staged).name)
            except StudioError:
                pass  # only costs one more read at the next check
